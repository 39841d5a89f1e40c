"""Engine and controller logs, kept to a size while their cluster runs.

A local cluster's engines write to ``<profile>/log/<cluster id>/engine-<pid>.log`` (the fork
server points their stdout and stderr there), its controller to
``<profile>/log/ipcontroller-<cluster id>-<pid>.log``; both append. A log past
``config.Retention.log_bytes`` is rotated in place: its latest ``log_bytes`` copied to
``<log>.1``, then the log emptied. Its writer keeps its descriptor and, appending, goes on at
the new end, so nothing restarts and a log never holds more than about twice the limit (lines
written between the copy and the emptying, a few at most, are lost). ``LogCap`` checks every few
seconds from a thread while its cluster runs; ``nbdist.gc()`` rotates the logs it keeps too.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

#: Seconds between a running cluster's looks at its logs' sizes (a stat per log).
CHECK_EVERY = 5.0


def rotated(log: Path) -> Path:
    """Where ``log``'s previous part goes: ``<log>.1``."""
    return log.with_name(log.name + ".1")


def rotate(log: Path, limit: int) -> int:
    """If ``log`` is over ``limit`` bytes: keep its last ``limit`` in ``<log>.1`` (replacing the
    one there) and empty it; the bytes freed (0 when under the limit or gone)."""
    try:
        size = os.stat(log, follow_symlinks=False).st_size
    except OSError:
        return 0
    if size <= limit:
        return 0
    old = rotated(log)
    try:
        before = os.stat(old, follow_symlinks=False).st_size
    except OSError:
        before = 0
    tmp = old.with_name(f".{old.name}.{os.getpid()}.tmp")
    fd = os.open(log, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.lseek(fd, max(0, size - limit), os.SEEK_SET)
        with open(tmp, "wb", opener=_private) as out:
            while chunk := os.read(fd, 1 << 20):
                out.write(chunk[: max(0, limit - out.tell())])
        os.replace(tmp, old)
        os.truncate(log, 0)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    return max(0, size + before - min(size, limit))


def _private(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW, 0o600)


def cluster_logs(log_dir: Path, controller_log: str | None = None) -> list[Path]:
    """A cluster's logs: every ``*.log`` in its folder, and its controller's, if any."""
    found = sorted(log_dir.glob("*.log")) if log_dir.is_dir() else []
    return found + ([Path(controller_log)] if controller_log else [])


class LogCap:
    """Rotates a running cluster's logs past ``limit`` bytes, every ``CHECK_EVERY`` seconds
    (``logs()`` lists them at each look) from a daemon thread, until ``stop``."""

    def __init__(self, logs: Callable[[], Iterable[Path]], limit: int, every: float = CHECK_EVERY):
        self._logs, self.limit, self.every = logs, limit, every
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one rotation at a time: the thread's, or a caller's
        self._thread = threading.Thread(target=self._run, name="nbdist-logcap", daemon=True)

    def start(self) -> LogCap:
        self._thread.start()
        return self

    def check(self) -> int:
        """Rotate every log over the limit now; the bytes freed."""
        freed = 0
        with self._lock:
            for log in self._logs():
                try:
                    freed += rotate(log, self.limit)
                except OSError:
                    pass  # gone meanwhile, or the disk is full: the next look tries again
        return freed

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.check()

    def stop(self) -> None:
        self._stop.set()
