"""One rank of a running cluster harmed from outside, by its engine's PID: slowed or killed.

``slowed(rank, share)`` and ``killer(rank, folder, at, within)`` make the ``around`` context
managers of ``bench_slow_link._races``: entered for each cell with the cluster, each yields
the race's ``watch`` argument and a dict of what it did (merged into the race's figures).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import threading
import time
from pathlib import Path

from . import _quota


def engine_pid(c, rank: int) -> int:
    """Rank ``rank``'s engine process on this machine (namespaced hosts' too: they share its
    PIDs), as the cluster knows it (``c.slots[rank].pid``), checked against the engine's own
    ``os.getpid()``."""
    c.run("import os as _os\n_nbdist_bench_pid = _os.getpid()")
    pid = c.pull("_nbdist_bench_pid", rank=rank)
    if pid != c.slots[rank].pid or not Path(f"/proc/{pid}").exists():
        raise RuntimeError(f"rank {rank}: the cluster says pid {c.slots[rank].pid}, the engine "
                           f"{pid}, not a process here")  # fmt: skip
    return pid


def slowed(rank: int, share: float):
    """``around``: rank ``rank``'s engine held to ``share`` of one core for the cell."""

    @contextlib.contextmanager
    def around(c):
        with _quota.quota(engine_pid(c, rank), share) as how:
            yield None, {"quota": how}

    return around


def killer(rank: int, folder: Path, at: int, within: float):
    """``around``: SIGKILLs rank ``rank``'s engine, by its PID, once that rank has written
    ``at`` steps to its file in ``folder`` (polled every 10 ms, ``within`` s at most); what it
    did: ``{"killed": the step}`` (0: the race ended first)."""
    cells = itertools.count()

    @contextlib.contextmanager
    def around(c):
        pid, path = engine_pid(c, rank), folder / f"steps-{next(cells)}"
        done, did = threading.Event(), {"killed": 0}

        def watch() -> None:
            deadline = time.monotonic() + within
            while not done.wait(0.01) and time.monotonic() < deadline:  # the poll interval
                with contextlib.suppress(OSError, ValueError):  # not written yet
                    if (steps := int(path.read_text())) >= at:
                        os.kill(pid, signal.SIGKILL)
                        did["killed"] = steps
                        return

        t = threading.Thread(target=watch, daemon=True)
        t.start()
        try:
            yield (str(path), rank), did
        finally:
            done.set()
            t.join()

    return around
