"""Tie a controller, fork server or engine to the notebook kernel that started it.

Loaded from the cluster profile's config files (and by the fork server), so it runs in every
process of a local cluster before they do anything else. When the kernel is gone (even killed by
SIGKILL, where no exit handler runs), each process kills what it started and exits: no orphans.

The kernel is named in ``$NBDIST_PARENT_PID`` by ``identity()``: its pid, this machine's boot id
and the kernel's start time (clock ticks since boot: clock changes do not move it), so a process
on another machine (a variable carried along by Slurm or mpiexec) or a later process given the
same pid is never taken for the kernel.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable

_PARENT_ENV = "NBDIST_PARENT_PID"
_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def _boot_id() -> str:
    try:
        with open(_BOOT_ID) as f:
            return f.read().strip()
    except OSError:  # not Linux
        return socket.gethostname()


def _started(pid: int) -> str | None:
    """When ``pid`` started, in clock ticks since boot (Linux); None when there is no ``pid``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]  # field 22, after "pid (name)"
    except FileNotFoundError:
        return None
    except OSError:  # not Linux
        import psutil

        try:
            return f"{psutil.Process(pid).create_time():.2f}"
        except psutil.Error:
            return None


def identity(pid: int | None = None) -> str:
    """``PID BOOT START``: the process ``pid`` (default: this one) as ``parent_check`` knows it."""
    pid = os.getpid() if pid is None else pid
    return f"{pid} {_boot_id()} {_started(pid)}"


def kill_descendants() -> None:
    """Kill every process this one started (and theirs), by PID."""
    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass
    except Exception:
        pass


def parent_check() -> Callable[[], bool] | None:
    """A function telling whether the kernel named by ``$NBDIST_PARENT_PID`` is still there;
    None where the variable is unset or names a process on another machine (engines started
    over ssh or by a scheduler: heartbeats cover them)."""
    import psutil

    try:
        pid, boot, start = os.environ.get(_PARENT_ENV, "").split()
        pid = int(pid)
    except ValueError:
        return None
    if pid <= 1 or boot != _boot_id():
        return None
    try:
        kernel = psutil.Process(pid)
    except psutil.Error:
        kernel = None
    if kernel is None or _started(pid) != start:  # gone (its pid may name another process now)
        return lambda: False

    def alive() -> bool:
        try:
            return kernel.is_running() and kernel.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    return alive


def exit_with_parent(period: float = 0.5) -> None:
    """Exit this process soon after the kernel is gone (a watcher thread; see ``parent_check``;
    the fork server, which must stay single-threaded, checks from its own loop instead)."""
    alive = parent_check()
    if alive is None:
        return

    def watch() -> None:
        while alive():
            time.sleep(period)
        kill_descendants()  # the controller's schedulers, an engine's data-loader workers
        os._exit(0)

    threading.Thread(target=watch, name="nbdist-lifeline", daemon=True).start()
