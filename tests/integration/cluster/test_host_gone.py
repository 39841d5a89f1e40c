"""A cluster host (``python -m nbdist.host``) leaves nothing behind: not the sockets of kernels that
watched it and left, and not, once SIGKILLed, its record, socket and lease file (the next host
sweeps what dead hosts left; an attached kernel closes its end and removes its host's)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import psutil
from processes import assert_gone, wait_until

from nbdist.notebook.cluster.engines.hosted import HostedEngines
from nbdist.records import registry
from nbdist.records.host import HostRecord


def _files(pid: int) -> list[str]:
    paths = (registry.record_path(pid), registry.socket_path(pid), registry.lease_path(pid))
    return [p.name for p in paths if p.exists()]


def _dead_hosts_leftovers() -> int:
    """The record, socket and lease of a host SIGKILLed earlier (named as a host is): its pid."""
    dead = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()", registry.HOST_MODULE],
        stdin=subprocess.PIPE,
    )
    dead.kill()
    dead.wait()
    dead.stdin.close()
    registry.write(HostRecord(pid=dead.pid, n=1, state="running", started=time.time()))
    registry.socket_path(dead.pid).touch()
    registry.lease_path(dead.pid).touch()
    return dead.pid


def _watchers(host: int) -> int:
    """Connections the host holds on its control socket (its listener not counted)."""
    path = str(registry.socket_path(host))
    held = psutil.Process(host).net_connections(kind="unix")
    return sum(c.laddr == path for c in held) - 1


def _lease_held(pid: int) -> bool:
    lease = str(registry.lease_path(pid))
    fds = [f"/proc/self/fd/{fd}" for fd in os.listdir("/proc/self/fd")]
    targets = []
    for link in fds:
        try:
            targets.append(os.readlink(link))
        except OSError:
            pass  # the listing's own descriptor, closed
    return any(t.startswith(lease) for t in targets)  # "(deleted)" too


def test_a_host_killed_without_a_word_leaves_nothing_behind(data_dir):
    dead = _dead_hosts_leftovers()
    host = subprocess.Popen(
        [sys.executable, "-m", registry.HOST_MODULE, "--n", "1"], stdin=subprocess.DEVNULL
    )
    engines = tree = None
    try:
        rec = wait_until(
            lambda: next((r for r in registry.live() if r.pid == host.pid), None), 120,
            what="the host's record",
        )  # fmt: skip
        assert _files(dead) == []  # swept as the host started
        rec = wait_until(
            lambda: next((r for r in registry.live() if r.state == "running"), None), 120,
            what="the host's cluster to run",
        )  # fmt: skip
        tree = psutil.Process(host.pid).children(recursive=True)

        # kernels that watched the host and left: their sockets are dropped there
        watchers = [socket.socket(socket.AF_UNIX) for _ in range(3)]
        for w in watchers:
            w.connect(rec.socket)
            w.sendall(b'{"op": "watch"}\n')
        wait_until(lambda: _watchers(host.pid) == 3, 30, what="the host to hold 3 watchers")
        for w in watchers:
            w.close()
        wait_until(lambda: _watchers(host.pid) == 0, 30, what="the host to drop the watchers")
        detached = HostedEngines(rec)  # %nbdist stop after an attach: its socket really closed
        detached.start()
        wait_until(lambda: _watchers(host.pid) == 1, 30, what="the attached kernel's watch")
        detached.stop()
        wait_until(lambda: _watchers(host.pid) == 0, 30, what="the host to see the kernel go")

        # a kernel attached when the host is SIGKILLed: its end closed, the host's files gone
        engines = HostedEngines(rec)
        engines.start()
        assert _lease_held(host.pid) and _watchers(host.pid) == 1
        os.kill(host.pid, signal.SIGKILL)
        assert engines.host_gone.wait(30), "the attached kernel did not see its host go"
        assert _files(host.pid) == []
        assert not _lease_held(host.pid)
        assert engines._watch.fileno() == -1
    finally:
        if engines is not None:
            engines.stop()
        if host.poll() is None:
            host.kill()
        host.wait(timeout=30)
    assert_gone(tree or [], timeout=30)  # the host's fork server takes its engines with it
