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
import select
import socket
import threading

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


class Kernel:
    """The kernel a process is tied to, as that process watches it: ``alive()``, and ``fd``, a
    pidfd that turns readable the moment the kernel ends (None where the OS has no pidfds), so
    a watcher can wait for the end without waking until it comes."""

    def __init__(self, pid: int | None):
        import psutil

        self.fd: int | None = None
        self._proc = None
        if pid is None:
            return
        try:
            self.fd = os.pidfd_open(pid)
        except (AttributeError, OSError):  # not Linux 5.3+: alive() polls psutil instead
            pass
        try:
            self._proc = psutil.Process(pid)
        except psutil.Error:
            self._proc = None

    def alive(self) -> bool:
        """Whether the kernel is still there (never blocks)."""
        import psutil

        if self._proc is None:
            return False
        if self.fd is not None:
            poll = select.poll()
            poll.register(self.fd, select.POLLIN)
            return not poll.poll(0)
        try:
            return self._proc.is_running() and self._proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def wait(self, period: float, until: int | None = None) -> bool:
        """Return once the kernel has ended (True): at that moment with a pidfd, else within
        ``period`` s; or, given ``until`` (a descriptor), once that turns readable (False)."""
        watched = [fd for fd in (self.fd, until) if fd is not None]
        while self.alive():
            if until is None and self.fd is not None:
                select.select(watched, [], [])
            elif until in select.select(watched, [], [], period)[0]:
                return False
        return True


def parent_check() -> Kernel | None:
    """The kernel named by ``$NBDIST_PARENT_PID``, to watch; None where the variable is unset
    or names a process on another machine (engines started over ssh or by a scheduler:
    heartbeats cover them). A kernel already gone (its pid may name another process now) is
    a ``Kernel`` that is not alive."""
    try:
        pid, boot, start = os.environ.get(_PARENT_ENV, "").split()
        pid = int(pid)
    except ValueError:
        return None
    if pid <= 1 or boot != _boot_id():
        return None
    kernel = Kernel(pid)
    if _started(pid) != start:  # read after the pidfd: then it cannot name a later process
        return Kernel(None)
    return kernel


def exit_with_parent(period: float = 0.5) -> None:
    """Exit this process the moment the kernel is gone (a watcher thread, blocked until then;
    see ``parent_check``; the fork server, which must be single-threaded when it forks,
    watches from its own loop instead, and from a thread it ends while it imports)."""
    kernel = parent_check()
    if kernel is None:
        return

    def watch() -> None:
        kernel.wait(period)
        kill_descendants()  # the controller's schedulers, an engine's data-loader workers
        os._exit(0)

    threading.Thread(target=watch, name="nbdist-lifeline", daemon=True).start()
