"""Checks before and just after remote engines start: which address of this machine the hosts
reach, whether each host is ready (over ssh, all at once, never prompting), how many threads
each engine gets, and whether the hosts run one environment.

Every failure is one line naming the host and the fix, raised before anything is left to
clean up.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import shlex
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import psutil

from ..... import config
from .....config import ClusterConfig, HostSpec, RemoteConfig
from .....errors import UsageError
from .....protocol import Inventory
from ... import inventory as envcheck
from ...hosts import missing_modules, ssh_command, ssh_failure

_MARK = "NBDIST-PREFLIGHT "
# Runs on each host with the Python named for it (sent on stdin: nothing to quote or install).
_PREFLIGHT = """
import importlib.util, json, os, platform, socket, sys
out = {"python": platform.python_version(), "executable": sys.executable,
       "missing": [m for m in ("ipyparallel", "torch", "nbdist")
                   if importlib.util.find_spec(m) is None]}
try:
    out["cpus"] = len(os.sched_getaffinity(0))
except AttributeError:
    out["cpus"] = os.cpu_count() or 1
try:
    out["interfaces"] = sorted(name for _, name in socket.if_nameindex())
except (AttributeError, OSError):
    out["interfaces"] = None
probe, timeout = PROBE, TIMEOUT
out["reach"] = ""
if probe:
    try:
        socket.create_connection(tuple(probe), timeout=timeout).close()
    except OSError as e:
        out["reach"] = str(e) or type(e).__name__
print(MARK + json.dumps(out), flush=True)
"""


@dataclass(frozen=True)
class HostFacts:
    """What the preflight found on a host that passed it."""

    python: str
    executable: str
    cpus: int
    interfaces: tuple[str, ...] | None  # None: the host cannot list them


# -- addresses ---------------------------------------------------------------------------------
def _local_addresses() -> dict[str, str]:
    """This machine's IP addresses and their interfaces."""
    return {
        a.address.split("%")[0]: name
        for name, addrs in psutil.net_if_addrs().items()
        for a in addrs
        if a.family in (socket.AF_INET, socket.AF_INET6)
    }


def _route_source(addr: str) -> str:
    """The address of this machine that traffic to ``addr`` leaves from (no packet is sent)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((addr, 9))
        return s.getsockname()[0]


def _resolve(host: HostSpec, timeout: float) -> str:
    """The address ssh would connect to for ``host`` (aliases from ~/.ssh/config included)."""
    name = host.name
    try:
        out = subprocess.run(
            [*ssh_command(host, timeout), "-G", "--", host.location],
            capture_output=True,
            text=True,
            timeout=10,
            stdin=subprocess.DEVNULL,
        ).stdout
        name = next((ln.split()[1] for ln in out.splitlines() if ln.startswith("hostname ")), name)
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        return socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except OSError:
        raise UsageError(ssh_failure(host, 255, "Could not resolve hostname", timeout)) from None


def choose_ip(rc: RemoteConfig) -> tuple[str, str]:
    """The address the controller listens on, and the one the engines connect to: the one
    named, or the one the hosts reach this machine by; every interface only when asked."""
    mine = _local_addresses()
    if rc.ip in ("*", "0.0.0.0"):
        return "0.0.0.0", _reachable(rc, mine)
    if rc.ip:
        if rc.ip not in mine:
            raise UsageError(
                f"--ip {rc.ip} is not an address of this machine; its addresses: "
                f"{', '.join(sorted(mine))}"
            )
        return rc.ip, rc.ip
    addr = _reachable(rc, mine)
    return addr, addr


def _reachable(rc: RemoteConfig, mine: dict[str, str]) -> str:
    """The address of this machine that the hosts (or the scheduler's nodes) reach."""
    if rc.launcher == "local":
        return "127.0.0.1"
    if not rc.hosts:  # a scheduler places the engines: the address of the default route
        try:
            return _route_source("192.0.2.1")
        except OSError:
            raise UsageError(
                f"cannot tell which address of this machine the {rc.launcher} engines reach: "
                f"name one with --ip (this machine has: {', '.join(sorted(mine))})"
            ) from None
    sources = {}
    for h in rc.hosts:
        try:
            sources[h.name] = _route_source(_resolve(h, rc.connect_timeout))
        except OSError:
            raise UsageError(
                f"host {h.name} cannot be reached from this machine (no route): check the "
                "network, or the address"
            ) from None
    outside = {a for a in sources.values() if not ipaddress.ip_address(a).is_loopback}
    if not outside:
        return "127.0.0.1"  # every host is this machine: nothing outside can connect
    if len(outside) == 1:
        return outside.pop()
    which = ", ".join(f"{h} via {a}" for h, a in sources.items())
    raise UsageError(
        f"the hosts are reached through different addresses of this machine ({which}): name "
        "the one they all reach with --ip"
    )


# -- each host, over ssh -----------------------------------------------------------------------
def preflight(rc: RemoteConfig, location: str) -> dict[str, HostFacts]:
    """Check every host at once: reached, login accepted, a Python with ipyparallel, torch and
    nbdist, the named interface there, and ``location`` (the controller's address) reachable
    from it. Raise one line per failing host, naming the fix; else what each host has."""
    if not rc.hosts:
        return {}
    # Can the hosts reach the controller's address? Each tries a connection to this.
    listener = socket.socket(socket.AF_INET6 if ":" in location else socket.AF_INET)
    listener.bind((location, 0))
    listener.listen(64)
    probe = [location, listener.getsockname()[1]]
    try:
        with ThreadPoolExecutor(min(16, len(rc.hosts))) as pool:
            results = list(pool.map(lambda h: _check_host(h, probe, rc.connect_timeout), rc.hosts))
    finally:
        listener.close()
    errors = [r for r in results if isinstance(r, str)]
    if errors:
        raise UsageError("; ".join(errors))
    return {h.name: r for h, r in zip(rc.hosts, results, strict=True)}


def _check_host(host: HostSpec, probe: list, t: float) -> HostFacts | str:
    """What ``host`` has, or one line saying what is wrong there."""
    script = (
        _PREFLIGHT.replace("PROBE", repr(probe))
        .replace("TIMEOUT", repr(t))
        .replace("MARK", repr(_MARK))
    )
    cmd = [*ssh_command(host, t), "--", host.location, f"{shlex.quote(host.python)} -"]
    try:
        r = subprocess.run(cmd, input=script, capture_output=True, text=True, timeout=3 * t)
    except subprocess.TimeoutExpired:
        return f"host {host.name} did not answer within {3 * t:g} s: check that it is up"
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith(_MARK)), None)
    if r.returncode != 0 or line is None:
        return ssh_failure(host, r.returncode, r.stderr, t)
    info = json.loads(line[len(_MARK) :])
    if info["missing"]:
        return missing_modules(host, info["missing"], info["executable"])
    names = info.get("interfaces")
    if host.interface and names is not None and host.interface not in names:
        return (
            f"host {host.name} has no network interface {host.interface!r}: name one of "
            f"{', '.join(names)} (interface = ... in the cluster file)"
        )
    if info["reach"]:
        return (
            f"host {host.name} cannot reach this machine at {probe[0]} ({info['reach']}): "
            "name an address of this machine that it reaches with --ip"
        )
    return HostFacts(
        python=info["python"],
        executable=info["executable"],
        cpus=int(info["cpus"]),
        interfaces=tuple(names) if names is not None else None,
    )


def threads_per_engine(cfg: ClusterConfig, facts: dict[str, HostFacts]) -> int:
    """Threads per engine: as given, or each host's CPUs shared among its engines (the
    smallest share, so that no host is oversubscribed). Unless ``cfg.oversubscribe``, refuses
    more engines on a host than its CPUs can serve (``config.engine_limit``), or more threads
    per engine than it has CPUs."""
    hosts = cfg.remote.hosts if cfg.remote is not None else ()
    for h in hosts if not cfg.oversubscribe else ():
        cpus = facts[h.name].cpus if h.name in facts else None
        if cpus is not None and h.engines > config.engine_limit(cpus):
            raise config.over_cpus(
                f"{h.engines} engines", cpus, config.engine_limit(cpus), f"host {h.name}"
            )
        if cpus is not None and (cfg.threads_per_engine or 0) > cpus:
            raise config.over_cpus(
                f"{cfg.threads_per_engine} threads per engine", cpus, cpus, f"host {h.name}"
            )
    if cfg.threads_per_engine:
        return cfg.threads_per_engine
    shares = [max(1, facts[h.name].cpus // h.engines) for h in hosts if h.name in facts]
    return min(shares) if shares else cfg.threads


# -- once the engines are in -------------------------------------------------------------------
def check_environments(
    inventory: dict[int, Inventory], hosts: tuple[HostSpec, ...], policy: str
) -> dict[int, Inventory]:
    """One environment across hosts: print the hosts' versions in one table, then refuse (or
    warn, by ``policy``) when they differ. Returns the inventory with each engine's
    ``host_index`` (its host's position in ``hosts``) set."""
    order = {h.name: i for i, h in enumerate(hosts)}
    marked = {
        eid: dataclasses.replace(inv, host_index=order[inv.host]) if inv.host in order else inv
        for eid, inv in inventory.items()
    }
    rows = envcheck.host_rows(marked)
    rows.sort(key=lambda r: order.get(r["host"], len(order)))
    print(envcheck.table(rows))
    envcheck.check(marked, policy)
    return marked
