"""Hosts for tests of engines on other hosts: a test sshd, and two network namespaces standing
for two machines with their own addresses, hostnames and (optionally) a shaped, slow link.

Shared by ``tests/integration/remote/test_remote.py``, ``test_slow_link.py`` and the slow-link
benchmark (which puts ``tests/`` on ``sys.path``), so it needs neither pytest nor conftest.

``Sshd(home, addr, netns=None, hostname=None)``
    An sshd with its own host key, client key, authorized-keys file and config, listening on
    one address (inside a namespace if named, under its own hostname if given, through
    ``unshare --uts``); a child of the caller tracked by PID, ``stop()`` ends it.
``TwoHosts(home, routed=False, rate=None, fast_link=False)``
    Namespaces "a" and "b", each with an sshd, ``/etc/netns/NAME/resolv.conf`` (a resolver
    that answers at once: without it every TCPStore connection waits 10 s on DNS) and
    ``/etc/netns/NAME/hosts``. Bridged (default): both on one bridge with this machine
    (10.77.0.1, .2 and .254), which they reach by the same address. Routed: each joined to
    this machine by a veth pair of its own, on a subnet of its own, so the hosts reach this
    machine by different addresses (name one with ``ip``) and each other through it (forwarding
    is switched on for those two interfaces only). ``rate="100mbit"`` shapes both ends of each
    pair with ``tc qdisc ... tbf`` (this kernel has no netem: no delay). ``fast_link`` adds a
    veth pair joining a and b directly (10.78.0.1 and .2: an InfiniBand stand-in).
    ``close()`` stops the sshds and undoes every step, in reverse; ``leftovers()`` names what
    is still there.

``unavailable()`` and ``sshd_unavailable()`` give the reason these cannot be made here, or None;
in a test, ``need_sshd()`` skips it for that reason.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

SSHD = "/usr/sbin/sshd"
NETNS_ETC = Path("/etc/netns")


def _poll(predicate, timeout: float, what: str):
    """Poll ``predicate`` until truthy; raise naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
    return value


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def toml(value) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml(v)}" for k, v in value.items()) + " }"
    return str(value)


def cluster_file(path: Path, hosts: list[dict], **top) -> str:
    """A TOML cluster file, as a person would write one."""
    lines = [f"{k} = {toml(v)}" for k, v in top.items()]
    for h in hosts:
        lines += ["", "[[hosts]]"] + [f"{k} = {toml(v)}" for k, v in h.items()]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def sshd_unavailable() -> str | None:
    """Why a test sshd cannot run here (None when it can); makes /run/sshd as root."""
    if not os.path.exists(SSHD):
        return "openssh-server is not installed (scripts/install-system-deps.sh)"
    if not os.path.isdir("/run/sshd"):  # sshd's privilege-separation directory
        if os.geteuid() != 0:
            return "/run/sshd is missing and only root can make it"
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    return None


def need_sshd() -> None:
    """Skip the calling test where a test sshd cannot run here (``sshd_unavailable``)."""
    import pytest  # here, not above: the benchmark imports this module without pytest

    if reason := sshd_unavailable():
        pytest.skip(reason)


def unavailable(shaped: bool = False) -> str | None:
    """Why ``TwoHosts`` cannot be made here (None when it can)."""
    if reason := sshd_unavailable():
        return reason
    if os.geteuid() != 0:
        return "two hosts from network namespaces need root (ip netns)"
    for tool in ("ip", "unshare") + (("tc",) if shaped else ()):
        if not shutil.which(tool):
            return f"no {tool} command (iproute2, util-linux) to make the hosts"
    probe = f"nbdprobe{os.getpid() % 100000}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"this machine does not allow network namespaces: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class Sshd:
    """An sshd for the test: its own keys and config, one listen address, optionally inside a
    network namespace under a hostname of its own; stopped (by PID) with ``stop()``."""

    def __init__(
        self,
        home: Path,
        addr: str = "127.0.0.1",
        netns: str | None = None,
        hostname: str | None = None,
    ):
        self.home, self.addr, self.netns = home, addr, netns
        home.mkdir(parents=True, exist_ok=True)
        os.chmod(home, 0o700)
        for name in ("host_key", "client_key"):
            if not (home / name).exists():
                subprocess.run(
                    ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / name)],
                    check=True,
                )
        (home / "authorized_keys").write_text((home / "client_key.pub").read_text())
        os.chmod(home / "authorized_keys", 0o600)
        self.port = free_port(addr) if netns is None else 2222
        (home / "sshd_config").write_text(
            textwrap.dedent(f"""\
            Port {self.port}
            ListenAddress {addr}
            HostKey {home / "host_key"}
            PidFile none
            AuthorizedKeysFile {home / "authorized_keys"}
            PermitRootLogin prohibit-password
            PasswordAuthentication no
            KbdInteractiveAuthentication no
            UsePAM no
            StrictModes no
            MaxStartups 100
            """)
        )
        self.known_hosts = home / "known_hosts"
        host_key = (home / "host_key.pub").read_text().split()
        names = [addr, "localhost"] if addr == "127.0.0.1" else [addr]
        self.known_hosts.write_text(
            "".join(f"[{name}]:{self.port} {host_key[0]} {host_key[1]}\n" for name in names)
        )
        cmd = [SSHD, "-D", "-e", "-f", str(home / "sshd_config")]
        if hostname:  # a UTS namespace of its own; every command exec's, so the PID is sshd's
            cmd = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hostname, *cmd]
        if netns:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        self.log = open(home / "sshd.log", "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        _poll(self._listening, 10, what=f"sshd on {addr}:{self.port}")

    def _listening(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"sshd exited: {(self.home / 'sshd.log').read_text()}")
        return f"Server listening on {self.addr}" in (self.home / "sshd.log").read_text()

    @property
    def user(self) -> str:
        return psutil.Process().username()

    def ssh_options(self, key: Path | None = None, known_hosts: Path | None = None) -> list:
        return [
            "-F",
            "/dev/null",
            "-i",
            str(key or self.home / "client_key"),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            f"UserKnownHostsFile={known_hosts or self.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
        ]

    def host(self, engines: int = 1, **over) -> dict:
        """This sshd as a cluster file's ``[[hosts]]`` entry."""
        return {
            "host": self.addr,
            "user": self.user,
            "port": self.port,
            "engines": engines,
            "ssh_options": self.ssh_options(),
            "python": sys.executable,
            **over,
        }

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def shape(dev: str, rate: str, netns: str | None = None) -> None:
    """Limit what leaves ``dev`` to ``rate`` (tc's units: "100mbit") with a token bucket whose
    burst is about 2 ms of traffic, so a transfer of a few MB is held to the rate."""
    burst = max(16_000, _bits(rate) // 8 // 500)
    ns = ["-n", netns] if netns else []
    subprocess.run(
        ["tc", *ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
         "burst", str(burst), "latency", "50ms"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip


def _bits(rate: str) -> int:
    """Bits per second from tc's notation ("100mbit", "1gbit", "800kbit")."""
    units = {"gbit": 10**9, "mbit": 10**6, "kbit": 10**3, "bit": 1}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return int(float(rate[: -len(unit)]) * scale)
    raise ValueError(f"rate {rate!r}: write it as tc does, e.g. '100mbit'")


class TwoHosts:
    """Two namespaces, "a" and "b", standing for two hosts (see the module docstring)."""

    def __init__(
        self,
        home: Path,
        routed: bool = False,
        rate: str | None = None,
        fast_link: bool = False,
    ):
        tag = f"{os.getpid() % 100000}"
        self.ns = {x: f"nbd{tag}{x}" for x in "ab"}
        self.hostname = {x: f"nbdist-host-{x}" for x in "ab"}
        self.iface = {x: f"nb{tag}{x}1" for x in "ab"}  # each host's end of its link
        self.outer = {x: f"nb{tag}{x}0" for x in "ab"}  # this machine's end of it
        self.fast_iface = {x: f"nb{tag}{x}f" for x in "ab"}
        self.fast = {"a": "10.78.0.1", "b": "10.78.0.2"}
        self.rate = rate
        if routed:  # a subnet per host, from the PID, so that two test runs do not collide
            k = 2 * (os.getpid() % 120)
            self.addr = {"a": f"10.79.{k}.1", "b": f"10.79.{k + 1}.1"}
            self.kernel_addr = {"a": f"10.79.{k}.254", "b": f"10.79.{k + 1}.254"}
        else:
            self.addr = {"a": "10.77.0.1", "b": "10.77.0.2"}
            self.kernel_addr = {"a": "10.77.0.254", "b": "10.77.0.254"}
        self.bridge = None if routed else f"nb{tag}br"
        self.sshd: dict[str, Sshd] = {}
        self._undo: list[tuple] = []  # ("ip", args) or ("rmtree", path), undone in reverse
        try:
            self._build(home, routed, fast_link)
        except BaseException:
            self.close()
            raise

    def _build(self, home: Path, routed: bool, fast_link: bool) -> None:
        if self.bridge:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._undo.append(("ip", "link", "del", self.bridge))
            _ip("addr", "add", "10.77.0.254/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        for x in "ab":
            ns, inner, outer = self.ns[x], self.iface[x], self.outer[x]
            self._etc(x)
            _ip("netns", "add", ns)
            self._undo.append(("ip", "netns", "del", ns))
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            self._undo.append(("ip", "link", "del", outer))
            _ip("link", "set", inner, "netns", ns)
            if self.bridge:
                _ip("link", "set", outer, "master", self.bridge, "up")
            else:
                _ip("addr", "add", f"{self.kernel_addr[x]}/24", "dev", outer)
                _ip("link", "set", outer, "up")
                Path(f"/proc/sys/net/ipv4/conf/{outer}/forwarding").write_text("1")
            _ip("-n", ns, "addr", "add", f"{self.addr[x]}/24", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            if routed:
                _ip("-n", ns, "route", "add", "default", "via", self.kernel_addr[x])
            if self.rate:
                shape(outer, self.rate)  # to the host
                shape(inner, self.rate, netns=ns)  # from the host
        if fast_link:
            a, b = self.fast_iface["a"], self.fast_iface["b"]
            _ip("link", "add", a, "netns", self.ns["a"], "type", "veth",
                "peer", "name", b, "netns", self.ns["b"])  # fmt: skip
            for x in "ab":
                ns, dev = self.ns[x], self.fast_iface[x]
                _ip("-n", ns, "addr", "add", f"{self.fast[x]}/24", "dev", dev)
                _ip("-n", ns, "link", "set", dev, "up")
        for x in "ab":
            self.sshd[x] = Sshd(
                home / x, addr=self.addr[x], netns=self.ns[x], hostname=self.hostname[x]
            )

    def _etc(self, x: str) -> None:
        """The host's resolver (answers at once: nothing listens) and hosts file, which
        ``ip netns exec`` mounts over /etc's."""
        etc = NETNS_ETC / self.ns[x]
        etc.mkdir(parents=True, exist_ok=True)
        self._undo.append(("rmtree", etc))
        (etc / "resolv.conf").write_text("nameserver 127.0.0.1\n")
        names = "".join(f"{self.addr[y]} {self.hostname[y]}\n" for y in "ab")
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n{names}")

    def host(self, x: str, **over) -> dict:
        """Host ``x`` as a cluster file's ``[[hosts]]`` entry (one engine unless ``engines``)."""
        return self.sshd[x].host(**{"engines": 1, **over})

    def link_bytes(self, x: str) -> int:
        """Bytes both ways through host ``x``'s link so far (its counters on this machine)."""
        stats = Path(f"/sys/class/net/{self.outer[x]}/statistics")
        return sum(int((stats / f"{d}_bytes").read_text()) for d in ("tx", "rx"))

    def pids(self) -> list[int]:
        return [s.proc.pid for s in self.sshd.values()]

    def leftovers(self) -> list[str]:
        """What of these hosts is still there (namespaces, links, /etc/netns folders)."""
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        left = [ns for ns in self.ns.values() if ns in names.split()]
        links = [*self.outer.values(), *([self.bridge] if self.bridge else [])]
        left += [d for d in links if Path(f"/sys/class/net/{d}").exists()]
        left += [str(NETNS_ETC / ns) for ns in self.ns.values() if (NETNS_ETC / ns).exists()]
        return left

    def close(self) -> None:
        for s in self.sshd.values():
            s.stop()
        self.sshd = {}
        while self._undo:
            kind, *args = self._undo.pop()
            if kind == "rmtree":
                shutil.rmtree(args[0], ignore_errors=True)
                try:
                    NETNS_ETC.rmdir()  # only when no other namespace keeps files there
                except OSError:
                    pass
            else:
                subprocess.run(["ip", *args], capture_output=True)
