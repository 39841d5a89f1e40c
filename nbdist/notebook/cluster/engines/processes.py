"""Processes and files of nbdist's clusters on this machine, shared by every engine set.

nbdist's ipyparallel profile (``records.profile``) is private to its owner and ties each
controller and engine to the kernel that started it (``nbdist.launch.lifeline``). Processes are
only ever ended by PID, and only those an engine set knows it started (``signal_own``,
``reap``); a ``Pids`` holds each as first seen, so a signal never reaches a later process given
the same pid. Imports no ipyparallel and no torch.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

from .... import datadir
from ....launch.lifeline import identity


def controller_config():
    """ipyparallel's launcher config for nbdist's controller (``nbdist.launch.controller``:
    ipyparallel's, with a heart monitor that registers new engines at once, leaving without
    the interpreter's teardown)."""
    from traitlets.config import Config

    cmd = [sys.executable, "-m", "nbdist.launch.controller"]
    return Config(LocalControllerLauncher={"controller_cmd": cmd})


def private_dir(path: Path) -> Path:
    """``path``, a folder in the data folder: made (mode 0700) if missing, else left as it is."""
    return datadir.private_dir(path)


def owner_only(security: Path) -> None:
    """Connection and cluster files hold keys and addresses: readable by their owner alone."""
    os.chmod(security, 0o700)
    for f in security.glob("*.json"):
        os.chmod(f, 0o600)


def tie_to_this_process() -> None:
    """Name this process (the kernel) as the one whose end ends the processes started from it
    (read by ``nbdist.launch.lifeline`` in the controller, the fork server and local engines)."""
    os.environ["NBDIST_PARENT_PID"] = identity()


def tree(pids: Iterable[int]) -> list[psutil.Process]:
    """The processes ``pids`` and all their descendants (those still running), each once. From
    a ``Pids``, only the processes first seen under its pids (never a later one given a pid)."""
    procs: list[psutil.Process] = []
    for pid in dict.fromkeys(pids):
        p = pids.process(pid) if isinstance(pids, Pids) else _process(pid)
        try:
            if p is not None:
                procs += [p, *p.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    return procs


def reap(procs: list[psutil.Process], timeout: float) -> None:
    """Wait for ``procs`` to leave; kill (by PID) those still there after ``timeout`` s."""
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=timeout)


class _Handle:
    """One process as first seen: a pidfd where the OS has them (a signal through it reaches
    that process or none, whatever became of its pid), and its ``psutil.Process`` (which tells
    a reused pid by the start time, to the clock tick) for the rest."""

    def __init__(self, pid: int):
        self.fd: int | None = None
        try:
            self.fd = os.pidfd_open(pid)
        except (AttributeError, OSError):  # not Linux 5.3+, or gone: psutil's check alone
            pass
        self.proc = psutil.Process(pid)  # NoSuchProcess when it is gone already

    def alive(self) -> bool:
        if self.fd is not None:
            poll = select.poll()
            poll.register(self.fd, select.POLLIN)
            return not poll.poll(0)  # a pidfd turns readable when its process ends
        try:
            return self.proc.is_running() and self.proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def send(self, sig: int) -> None:
        try:
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, sig)
            else:
                self.proc.send_signal(sig)  # psutil refuses a pid given to another process
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    __del__ = close


class Pids(set):
    """Pids this kernel may signal, each held as the process first seen under it (``_Handle``),
    so that a signal never reaches a later process given the same pid. Used as a set of ints."""

    def __init__(self, pids: Iterable[int] = ()):
        super().__init__()
        self._first: dict[int, _Handle | None] = {}
        self.update(pids)

    def add(self, pid: int) -> None:
        """Add ``pid``, holding the process it names now (unless already here)."""
        if pid not in self:
            try:
                self._first[pid] = _Handle(pid)
            except psutil.NoSuchProcess:
                self._first[pid] = None  # gone already: nothing to signal
        super().add(pid)

    def update(self, *others: Iterable[int]) -> None:
        for other in others:
            for pid in other:
                self.add(pid)

    def discard(self, pid: int) -> None:
        super().discard(pid)
        handle = self._first.pop(pid, None)
        if handle is not None:
            handle.close()

    def difference_update(self, *others: Iterable[int]) -> None:
        for other in others:
            for pid in list(other):
                self.discard(pid)

    def clear(self) -> None:
        for pid in list(self):
            self.discard(pid)

    def process(self, pid: int) -> psutil.Process | None:
        """The process first seen under ``pid`` while it runs; None if it ended or is not ours."""
        handle = self._first.get(pid) if pid in self else None
        return handle.proc if handle is not None and handle.alive() else None

    def send_signal(self, pid: int, sig: int) -> None:
        """Send ``sig`` to the process first seen under ``pid`` (if ours and still running)."""
        handle = self._first.get(pid) if pid in self else None
        if handle is not None:
            handle.send(sig)


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def signal_own(pids: Iterable[int], own: set[int], sig: int) -> None:
    """Send ``sig`` to those of ``pids`` that are in ``own`` (never to a stranger's pid: when
    ``own`` is a ``Pids``, only to the process first seen under each pid)."""
    for pid in pids:
        if pid in own and isinstance(own, Pids):
            own.send_signal(pid, sig)
        elif pid in own:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def wait_for(predicate: Callable[[], object], timeout: float, period: float = 0.02) -> bool:
    """Poll ``predicate`` until it is true (True) or ``timeout`` s have passed (False)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(period)
    return True


def remove_cluster_files(profile: Path, cluster_id: str) -> None:
    """No stale records: a cluster's ipyparallel cluster file, connection files and hub state."""
    security = profile / "security"
    for f in [
        *security.glob(f"cluster-{cluster_id}.json"),
        *security.glob(f"ipcontroller-{cluster_id}-*.json"),
        *(profile / "log").glob(f"engines{cluster_id}.json"),
    ]:
        f.unlink(missing_ok=True)


def close_quietly(closable: object | None) -> None:
    """``closable.close()``, where an error only means there is nothing left to close."""
    if closable is not None:
        try:
            closable.close()
        except Exception:
            pass
