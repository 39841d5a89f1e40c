"""Engines on other hosts, started over SSH or through a scheduler by ipyparallel's launchers.

``RemoteEngines`` has EngineCluster's interface (``start() -> client``, ``client``, ``exits``,
``signal``, ``add_engines``, ``processes``, ``stop``, ``engine_pids``, ``cluster_id``,
``log_dir``), so the session treats local and remote engines alike. The launchers are
ipyparallel's own (``ssh``, ``slurm``, ``mpi``, ``local``), with their options passed through.

Networking:

- The controller listens on one address that the hosts reach: the one named (``ip=``), or the
  address this machine's traffic to the hosts leaves from. Every interface only when asked
  (``ip="*"``).
- Messages are signed (HMAC-SHA256 with the key in the connection info, ipyparallel's default;
  checked at start). The connection info reaches the engines in their environment, through
  ssh's standard input: no key is written on the hosts, none shows on a command line. Local
  connection files are readable by their owner alone.
- MASTER_ADDR is rank 0's host address as the other hosts reach it (``address_of``): the
  host's ``address``, else its ``interface``'s, else the address it reaches the controller from.

Failing well: before anything starts, every host is checked at once over ssh (never prompting,
with a connect timeout): reached, login accepted, a Python with ipyparallel, torch and nbdist,
the named interface present, and the controller's address reachable from there. Each failure is
one line naming the host and the fix; nothing is left to clean up.

Lifetime: ``stop`` asks the engines to leave, kills the stragglers (through their nanny, then
over ssh: only processes of this cluster), stops the controller, and removes this cluster's
folder on every host and its files here. If the kernel dies instead, the engines leave after
missing the controller's heartbeats (about 10 s); only their log folder stays on the host.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import queue
import shlex
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import ipyparallel as ipp
import psutil
from ipyparallel.cluster import launcher as ipp_launcher
from ipyparallel.cluster.shellcmd import ShellCommandSend

from ..config import ClusterConfig, HostSpec, RemoteConfig
from ..errors import NbdistError, UsageError
from ..worker import rendezvous
from .cluster import profile_dir, reap
from .hosts import missing_modules, remote_dir_of, ssh_command, ssh_failure

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
# Engines of remote hosts: quiet logs, no IPython history database, and gone ~10 s after the
# controller is (15 missed heartbeats: the kernel died, or this machine went away).
_ENGINE_ARGS = [
    "--log-level=WARN", "--HistoryManager.enabled=False", "--IPEngine.max_heartbeat_misses=15",
]


class _SSHEngineLauncher(ipp_launcher.SSHEngineLauncher):
    """ipyparallel's SSH engine launcher (its shell detection, its remote starter, its kill),
    leaner. The checks run once per host, not per engine: no ``python --version`` or
    ``ipython profile create`` (the preflight checked the Python; a mkdir makes the folder).
    The engines of a host start at once, each in a thread. No ssh session per engine polls it
    (the controller reports deaths: the nanny within milliseconds, heartbeats for a lost
    host), and no output is copied back at exit."""

    def _start_waiting(self):
        pass

    def get_output(self, remove=False):
        return ""

    @property
    def ssh_sender(self):
        if self._ssh_sender is None:  # the starter's code goes along: no ipyparallel import
            self._ssh_sender = ShellCommandSend(
                self.ssh_cmd, [*self.ssh_args, self.location], self.remote_python,
                send_receiver_code=True, log=self.log,
            )
        return self._ssh_sender

    def start(self, hostname=None, user=None, port=None):
        engine_set = self.parent
        if engine_set.cancelled:
            raise _Cancelled()
        self.hostname, self.user = hostname or self.hostname, user or self.user
        first = engine_set.first_on.get(self.location)
        if first is None:
            engine_set.first_on[self.location] = self
            log_dir = os.path.dirname(self.remote_output_file)
            self.ssh_sender.check_output(f"umask 077 && mkdir -p -- {shlex.quote(log_dir)}")
        else:
            self._ssh_sender = first.ssh_sender  # its shell is known, its folder made
        engine_set.spawn(self._start_engine)

    def _start_engine(self) -> None:
        pid = self.ssh_sender.cmd_start(
            self.program + self.program_args,
            env=self.get_env(),
            output_file=self.remote_output_file,
        )
        self.pid = pid
        self.notify_start({"host": self.location, "pid": pid})


class _Cancelled(Exception):
    pass


class _SSHEngineSetLauncher(ipp_launcher.SSHEngineSetLauncher):
    """ipyparallel's SSH engine-set launcher, started in a thread of its own (and each engine
    in one more), so that hosts and engines start at the same time. ``error`` holds what
    stopped it; ``wait()`` stops it and joins its threads."""

    launcher_class = _SSHEngineLauncher

    def start(self, n):
        self.error: BaseException | None = None
        self.cancelled = False
        self.first_on: dict = {}
        self._threads: list[threading.Thread] = []
        self.spawn(lambda: ipp_launcher.SSHEngineSetLauncher.start(self, n))
        return []

    def spawn(self, target) -> None:
        """Run ``target`` in a thread; keep its error for RemoteEngines to raise."""

        def run():
            try:
                target()
            except BaseException as exc:
                self.error = self.error or exc

        t = threading.Thread(target=run, name="nbdist-ssh-launch", daemon=True)
        self._threads.append(t)
        t.start()

    def wait(self, timeout: float) -> None:
        """Start no more engines; wait for those being started (ssh calls) to be done."""
        self.cancelled = True
        deadline = time.monotonic() + timeout
        i = 0
        while i < len(self._threads):  # the list grows while the first thread runs
            self._threads[i].join(max(0.0, deadline - time.monotonic()))
            i += 1


_LAUNCHER_CLASSES = {
    "ssh": _SSHEngineSetLauncher,
    "slurm": ipp_launcher.SlurmEngineSetLauncher,
    "mpi": ipp_launcher.MPIEngineSetLauncher,
    "local": ipp_launcher.LocalEngineSetLauncher,
}


def launcher_options(kind: str, options: dict) -> dict:
    """``options`` checked against the options of ipyparallel's ``kind`` engine launcher, and
    strings (from ``--launcher-opt KEY=VALUE``) converted to the option's type."""
    cls = _LAUNCHER_CLASSES[kind]
    traits = cls.class_traits(config=True)
    out = {}
    for key, value in options.items():
        if key not in traits:
            raise UsageError(
                f"the {kind} launcher has no option {key!r}; its options: "
                f"{', '.join(sorted(traits))}"
            )
        if isinstance(value, str):
            try:
                value = traits[key].from_string(value)
            except Exception as exc:
                raise UsageError(f"launcher option {key}={value!r}: {exc}") from None
        out[key] = value
    return out


@dataclass(frozen=True)
class RemoteExit:
    """A remote engine left the cluster: its process ended, or its host stopped answering
    (the controller cannot tell which, nor the exit status)."""

    pid: int
    host: str
    engine_id: int
    status: int | None = None

    def describe(self) -> str:
        return f"on host {self.host} left the cluster (it ended, or its host stopped answering)"


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
            [*ssh_command(host, timeout), "-G", host.location],
            capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL,
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


# -- the engines -----------------------------------------------------------------------------
def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


class RemoteEngines:
    """An ipyparallel controller here, with engines started by one of ipyparallel's launchers."""

    hosted = False  # this kernel owns them: %nbdist stop stops them

    def __init__(self, cfg: ClusterConfig):
        if cfg.remote is None:
            raise ValueError("RemoteEngines needs a ClusterConfig with remote settings")
        self.cfg = cfg
        self.remote: RemoteConfig = cfg.remote
        self.cluster_id = "nbdist-" + uuid.uuid4().hex[:8]
        os.environ["NBDIST_PARENT_PID"] = str(os.getpid())  # local launcher: nbdist._lifeline
        self._profile = profile_dir()
        self.log_dir = _private_dir(self._profile / "log" / self.cluster_id)
        self.remote_dir = remote_dir_of(self.remote, self.cluster_id)
        self.client: ipp.Client | None = None
        self.engine_pids: set[int] = set()
        self.exits: queue.Queue[RemoteExit] = queue.Queue()
        self.preflight: dict[str, dict] = {}  # host -> what the preflight found there
        self.location = ""  # the controller's address as the engines reach it
        self._hosts = {h.name: h for h in self.remote.hosts}
        self._options = launcher_options(self.remote.launcher, self.remote.launcher_options)
        self._ipp: ipp.Cluster | None = None
        self._host_of: dict[int, str | None] = {}  # engine id -> host name (None: unnamed)
        self._pid_of: dict[int, int] = {}  # engine id -> pid on its host
        self._gone: set[int] = set()  # engine ids that left, or that we killed
        self._vacant: list[str] = []  # hosts of engines that left: replacements go there first
        self._sets = 0
        self._set_host: dict[str, str | None] = {}  # engine set id -> its host
        self._stopping = False
        self._stopped = False

    # -- start ------------------------------------------------------------------------------
    def start(self) -> ipp.Client:
        """Check the hosts, start the controller and the engines; return a connected client
        once every engine has registered. On failure, everything started is stopped."""
        try:
            ip, self.location = choose_ip(self.remote)
            with ThreadPoolExecutor(1) as pool:  # the hosts are checked while the controller starts
                checked = pool.submit(self._preflight, self.location)
                try:
                    self._start_controller(ip)
                finally:
                    checked.result()
            self.cfg = dataclasses.replace(self.cfg, ip=ip, threads_per_engine=self._threads())
            plan = (
                Counter({h.name: h.engines for h in self.remote.hosts})
                if self.remote.launcher == "ssh"
                else Counter({None: self.cfg.n})
            )
            self._launch_and_wait(plan, known=set())
        except BaseException as exc:
            self.stop()
            if isinstance(exc, (KeyboardInterrupt, NbdistError)):
                raise
            raise NbdistError(f"the remote engines did not start: {exc}") from exc
        return self.client

    def _preflight(self, location: str) -> None:
        """Check every host at once; raise one line per failing host, naming the fix."""
        if not self.remote.hosts:
            return
        # Can the hosts reach the controller's address? Each tries a connection to this.
        listener = socket.socket(socket.AF_INET6 if ":" in location else socket.AF_INET)
        listener.bind((location, 0))
        listener.listen(64)
        probe = [location, listener.getsockname()[1]]
        try:
            with ThreadPoolExecutor(min(16, len(self.remote.hosts))) as pool:
                results = list(pool.map(lambda h: self._check_host(h, probe), self.remote.hosts))
        finally:
            listener.close()
        errors = [r for r in results if isinstance(r, str)]
        if errors:
            raise UsageError("; ".join(errors))
        self.preflight = {h.name: r for h, r in zip(self.remote.hosts, results, strict=True)}

    def _check_host(self, host: HostSpec, probe: list | None) -> dict | str:
        t = self.remote.connect_timeout
        script = (
            _PREFLIGHT.replace("PROBE", repr(probe))
            .replace("TIMEOUT", repr(t))
            .replace("MARK", repr(_MARK))
        )
        cmd = [*ssh_command(host, t), host.location, f"{shlex.quote(host.python)} -"]
        try:
            r = subprocess.run(cmd, input=script, capture_output=True, text=True, timeout=3 * t)
        except subprocess.TimeoutExpired:
            return f"host {host.name} did not answer within {3 * t:g} s: check that it is up"
        line = next((ln for ln in r.stdout.splitlines() if ln.startswith(_MARK)), None)
        if r.returncode != 0 or line is None:
            return ssh_failure(host, r.returncode, r.stderr, t)
        info = json.loads(line[len(_MARK):])
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
        return info

    def _threads(self) -> int:
        """Threads per engine: as given, or each host's CPUs shared among its engines (the
        smallest share, so that no host is oversubscribed)."""
        if self.cfg.threads_per_engine:
            return self.cfg.threads_per_engine
        shares = [
            max(1, self.preflight[h.name]["cpus"] // h.engines)
            for h in self.remote.hosts
            if h.name in self.preflight
        ]
        return min(shares) if shares else self.cfg.threads

    def _start_controller(self, ip: str) -> None:
        # listening everywhere: tell the engines the one address to use
        location = {"controller_location": self.location} if ip == "0.0.0.0" else {}
        self._ipp = ipp.Cluster(
            n=0,
            engines=_LAUNCHER_CLASSES[self.remote.launcher],
            profile_dir=str(self._profile),
            cluster_id=self.cluster_id,
            controller_ip=ip,
            controller_args=[
                f"--HeartMonitor.period={self.cfg.heartbeat_ms}",
                f"--HeartMonitor.max_heartmonitor_misses={self.cfg.heartbeat_misses}",
            ],
            shutdown_atexit=False,  # the session stops us at exit: one stop, in order
            log_level=40,
            **location,
        )
        self._ipp.start_controller_sync()
        self.client = self._ipp.connect_client_sync()  # waits for the connection files
        security = Path(self._ipp.profile_dir) / "security"
        _owner_only(security)
        info = json.loads((security / f"ipcontroller-{self.cluster_id}-engine.json").read_text())
        if not info.get("key") or not str(info.get("signature_scheme", "")).startswith("hmac-"):
            raise NbdistError("the controller does not sign its messages: refusing to start")
        # ipyparallel calls these on its own thread when an engine registers or leaves.
        self.client._registration_callbacks.append(self._on_registration)

    @property
    def cluster_file(self) -> str:
        """ipyparallel's record of this cluster (read by the sidebar)."""
        return self._ipp.cluster_file if self._ipp is not None else ""

    # -- engines ----------------------------------------------------------------------------
    def _launch(self, host: str | None, n: int) -> str:
        """Start ``n`` engines on ``host`` (None: wherever the launcher puts them); return the
        engine set's id. Over ssh the engines start in the background (see _SSHEngineSet...)."""
        set_id = f"{host or self.remote.launcher}-{self._sets}"
        self._sets += 1
        self._set_host[set_id] = host
        # the cluster id on the command line: how the cleanup over ssh knows our processes
        args = [*_ENGINE_ARGS, f"--cluster-id={self.cluster_id}"]
        kwargs = dict(self._options, engine_args=args)
        if "batch_file_name" in _LAUNCHER_CLASSES[self.remote.launcher].class_traits():
            # the batch script goes with the logs, not into the notebook's folder
            kwargs.setdefault("batch_file_name", str(self.log_dir / f"{set_id}.batch"))
        if host is not None:
            h = self._hosts[host]
            kwargs.update(
                engines={h.location: {"n": n, "to_send": []}},  # connection info: environment
                ssh_args=ssh_command(h, self.remote.connect_timeout)[1:],
                remote_python=h.python,
                remote_profile_dir=self.remote_dir,
                environment={**h.environment, "NBDIST_HOST": h.name},
                delay=0.0,
            )
        try:
            self._ipp.start_engines_sync(n, engine_set_id=set_id, **kwargs)
        except Exception as exc:
            raise NbdistError(self._launch_failed(host, exc)) from exc
        return set_id

    def _launch_failed(self, host: str | None, exc: BaseException) -> str:
        where = f"host {host}" if host else f"the {self.remote.launcher} launcher"
        if isinstance(exc, subprocess.CalledProcessError):
            detail = f"{exc.cmd[0]} exited with status {exc.returncode}: {exc.output or ''}"
        else:
            detail = str(exc) or type(exc).__name__
        return f"{where}: starting engines failed ({_one_line(detail)})"

    def _launch_and_wait(self, plan: Counter, known: set[int]) -> list[int]:
        sets = {self._launch(host, n): host for host, n in plan.items()}
        want = sum(plan.values())
        deadline = time.monotonic() + self.cfg.start_timeout
        while True:
            new = sorted(set(self.client.ids) - known - set(self._host_of))
            if len(new) >= want:
                break
            for set_id, host in sets.items():
                error = getattr(self._ipp.engines.get(set_id), "error", None)
                if error is not None:
                    raise NbdistError(self._launch_failed(host, error))
            if time.monotonic() > deadline:
                self._identify(new)
                raise NbdistError(self._not_registered(plan, new))
            time.sleep(0.02)
        new = new[:want]
        self._identify(new)
        return new

    def _identify(self, ids: list[int]) -> None:
        """Learn each new engine's pid and host (the name its launcher gave it)."""
        pids = {eid: self.client[eid].apply_async(os.getpid) for eid in ids}
        hosts = {eid: self.client[eid].apply_async(os.getenv, "NBDIST_HOST") for eid in ids}
        for eid in ids:
            self._pid_of[eid] = pids[eid].get(self.cfg.start_timeout)
            self._host_of[eid] = hosts[eid].get(self.cfg.start_timeout)
            self.engine_pids.add(self._pid_of[eid])

    def _not_registered(self, plan: Counter, new: list[int]) -> str:
        came = Counter(self._host_of[e] for e in new)
        short = [(h, n - came[h]) for h, n in plan.items() if came[h] < n]
        parts = []
        for host, k in short:
            where = f"on host {host}" if host else f"from the {self.remote.launcher} launcher"
            last = self._remote_tail(host) if host else ""
            parts.append(f"{k} engine(s) {where}" + (f" (last output: {last})" if last else ""))
        return (
            f"{', '.join(parts)} did not register within {self.cfg.start_timeout:g} s: check "
            f"that the hosts reach this machine at {self.cfg.ip}"
        )

    def _remote_tail(self, host: str) -> str:
        h = self._hosts[host]
        out = self._ssh_sh(h, f"tail -qn 2 {shlex.quote(self.remote_dir)}/log/*.out 2>/dev/null")
        return _one_line(out)

    def _ssh_sh(self, h: HostSpec, script: str) -> str:
        """Run a POSIX shell script on ``h`` (sent on stdin: the login shell may be any)."""
        t = self.remote.connect_timeout
        try:
            r = subprocess.run(
                [*ssh_command(h, t), h.location, "sh -s"],
                input=script, capture_output=True, text=True, timeout=3 * t,
            )
            return r.stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    def add_engines(self, n: int, known: set[int]) -> list[int]:
        """Start ``n`` more engines (on the hosts whose engines left, first); return their ids
        once they have registered."""
        if self.remote.launcher != "ssh":
            return self._launch_and_wait(Counter({None: n}), known)
        hosts = []
        while self._vacant and len(hosts) < n:
            hosts.append(self._vacant.pop(0))
        live = Counter(h for e, h in self._host_of.items() if e not in self._gone)
        while len(hosts) < n:  # then the host with the fewest engines
            name = min(self._hosts, key=lambda h: (live[h] + hosts.count(h), 0))
            hosts.append(name)
        return self._launch_and_wait(Counter(hosts), known)

    def _on_registration(self, event: dict) -> None:
        if event.get("event") != "unregister" or self._stopping:
            return
        eid = int(event["id"])
        if eid in self._pid_of:
            self._leave(eid)
            self.exits.put(RemoteExit(self._pid_of[eid], self._host_of[eid] or "?", eid))

    def _leave(self, eid: int) -> None:
        if eid not in self._gone:
            self._gone.add(eid)
            if self._host_of.get(eid) in self._hosts:
                self._vacant.append(self._host_of[eid])

    def signal(self, pids: list[int], sig: int = signal.SIGINT) -> None:
        """Send ``sig`` to these engines (ours only), relayed by each engine's nanny."""
        by_pid = {p: e for e, p in self._pid_of.items() if e not in self._gone}
        eids = [by_pid[p] for p in pids if p in self.engine_pids and p in by_pid]
        if self.client is None or not eids:
            return
        if sig == signal.SIGKILL:
            for eid in eids:
                self._leave(eid)
        targets = [e for e in eids if e in self.client.ids]
        if targets:
            try:
                self.client.send_signal(signal.Signals(sig).name, targets=targets, block=False)
            except Exception:
                pass  # the engine left meanwhile

    def address_of(self, engine_id: int) -> str:
        """The address of this engine's host as the other hosts reach it (for MASTER_ADDR)."""
        host = self._hosts.get(self._host_of.get(engine_id) or "")
        if host is not None and host.address:
            return host.address
        ar = self.client[engine_id].apply_async(
            rendezvous.host_address, self.location, host.interface if host else None
        )
        try:
            return ar.get(self.cfg.start_timeout)
        except Exception as exc:
            where = host.name if host else f"engine {engine_id}"
            raise UsageError(f"host {where}: {_one_line(exc)}") from None

    def check(self, inventory: dict[int, dict]) -> None:
        """One environment across hosts: show the hosts' versions in one table, then refuse
        (or warn, by option) when they differ. Also marks each engine's host order."""
        from . import inventory as envcheck

        order = {name: i for i, name in enumerate(self._hosts)}
        for inv in inventory.values():
            if inv["host"] in order:
                inv["host_index"] = order[inv["host"]]
        rows = envcheck.host_rows(inventory)
        rows.sort(key=lambda r: order.get(r["host"], len(order)))
        print(envcheck.table(rows))
        envcheck.check(inventory, self.remote.env_check)

    def remote_pids(self) -> dict[str, list[int]]:
        """Engine pids on each host (for the engines that registered and have not left)."""
        out: dict[str, list[int]] = {}
        for eid, pid in self._pid_of.items():
            if eid not in self._gone:
                out.setdefault(self._host_of[eid] or "?", []).append(pid)
        return out

    def processes(self) -> list[psutil.Process]:
        """This cluster's processes on this machine: the controller, and the launcher's local
        processes (local engines, mpiexec). Engines on other hosts are in ``remote_pids()``."""
        roots = []
        ctl = getattr(self._ipp.controller, "process", None) if self._ipp else None
        if ctl is not None:
            roots.append(ctl.pid)
        for es in (self._ipp.engines.values() if self._ipp else []):
            for launcher in [es, *getattr(es, "launchers", {}).values()]:
                proc = getattr(launcher, "process", None)
                if proc is not None and not isinstance(launcher, _SSHEngineLauncher):
                    roots.append(proc.pid)
        procs = []
        for pid in dict.fromkeys(roots):
            try:
                p = psutil.Process(pid)
                procs += [p, *p.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        return procs

    # -- stop -------------------------------------------------------------------------------
    def stop(self, timeout: float = 5.0) -> None:
        """Stop every engine and the controller; remove this cluster's files here and on the
        hosts. Safe to call twice, and after a failed start."""
        if self._stopped:
            return
        self._stopping = True
        procs = self.processes()
        if self.client is not None:
            self._stop_engines(timeout)
            try:
                self.client.close()
            except Exception:
                pass
            self.client = None
        if self._ipp is not None:
            self._stop_launchers()
            try:
                self._ipp.stop_controller_sync()
            except Exception:
                pass
        reap(procs, timeout)
        self._remove_files()
        self.engine_pids.clear()
        self._stopped = True

    def _stop_engines(self, timeout: float) -> None:
        """Ask every engine to leave; kill (through its nanny) any still there after a while."""
        ids = list(self.client.ids)
        if not ids:
            return
        try:
            self.client.shutdown(targets=ids, hub=False, block=False)
        except Exception:
            pass
        if _wait(lambda: not set(ids) & set(self.client.ids), timeout / 2):
            return
        left = [e for e in ids if e in self.client.ids]
        try:
            self.client.send_signal("SIGKILL", targets=left, block=False)
        except Exception:
            pass
        _wait(lambda: not set(left) & set(self.client.ids), timeout / 2)

    def _stop_launchers(self) -> None:
        """Engines that never registered or would not leave: ended by their launcher. Over ssh,
        one call per host kills this cluster's processes there and removes its folder."""
        ssh_hosts: dict[str, list[int]] = {}
        for set_id, es in list(self._ipp.engines.items()):
            if isinstance(es, _SSHEngineSetLauncher):
                es.wait(3 * self.remote.connect_timeout)  # no engine may start after this
                pids = ssh_hosts.setdefault(self._set_host[set_id], [])
                pids += [la.pid for la in es.launchers.values() if getattr(la, "pid", 0)]
            else:
                try:
                    self._ipp.stop_engines_sync(set_id)
                except Exception:
                    pass
        self._ipp.engines.clear()
        if not ssh_hosts:
            return
        with ThreadPoolExecutor(min(16, len(ssh_hosts))) as pool:
            for name, pids in ssh_hosts.items():
                pool.submit(self._ssh_sh, self._hosts[name], self._cleanup_script(pids))

    def _cleanup_script(self, pids: list[int]) -> str:
        ids = " ".join(str(p) for p in pids if p and p > 0)
        d = shlex.quote(self.remote_dir)
        return (
            f"for p in {ids}; do\n"
            f'  case "$(ps -o args= -p $p 2>/dev/null)" in *{self.cluster_id}*) kill -9 $p;; esac\n'
            "done\n"
            f"rm -rf -- {d}\n"
            f"rmdir -- {shlex.quote(self.remote.remote_dir)} 2>/dev/null\n"
            "exit 0\n"
        )

    def _remove_files(self) -> None:
        """No stale records: this cluster's ipyparallel cluster file and connection files."""
        security = self._profile / "security"
        for f in [
            *security.glob(f"cluster-{self.cluster_id}.json"),
            *security.glob(f"ipcontroller-{self.cluster_id}-*.json"),
            *(self._profile / "log").glob(f"engines{self.cluster_id}.json"),  # the hub's state
        ]:
            try:
                f.unlink()
            except FileNotFoundError:
                pass


def _owner_only(security: Path) -> None:
    """Connection and cluster files hold keys and addresses: readable by their owner alone."""
    os.chmod(security, 0o700)
    for f in security.glob("*.json"):
        os.chmod(f, 0o600)


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _one_line(value, limit: int = 200) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
