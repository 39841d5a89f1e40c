"""torch.profiler on this rank, for a cell or its first steps (``%%distributed --profile``).

``start(steps)`` opens the profiler before the cell's code runs: ``True`` for the whole cell, or
``N`` for N steps (after the first), a step ending at each ``report()`` call (``reporting.calls``
calls ``step()``);
``finish()`` closes it when the cell ends and says what it saw as a ``ProfileResult``: the
window's wall time and steps, the time spent waiting for data (the batches of nbdist's loaders,
timed by ``reporting.datawait``, or a ``DataLoader``'s iteration as the profiler saw it), each
collective's duration (gloo's, NCCL's and DDP's through shared memory, in the order they
started: the notebook matches them across ranks and reads from their differences who waited for
whom), and the Chrome trace, for the kernel to merge with the other ranks'. Nothing of this
runs unless a cell asks for it.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import sys
import tempfile
import time
from collections.abc import Iterator

from ...protocol import ProfileResult
from ..collectives import group
from ..reporting.calls import on_step
from ..reporting.datawait import waits

_MAX_TRACE = 64 * 2**20  # bytes of compressed trace sent to the notebook, at most
_COLLECTIVES = ("gloo:", "nccl:", f"{group.NAME}:")  # the last: DDP's through shared memory
_DATA = "enumerate(DataLoader)"


class _Window:
    """One profiled window: the profiler, and the steps counted in it.

    Figures are those of whole steps, from the first ``report()`` on: what comes before it (the
    profiler's start, building the model, the first pass and its first collectives) is no step.
    With ``N`` steps the profiler itself skips that first one (its warm-up) and records the N
    steps after it; for the whole cell it records everything, and only what falls between the
    first and the last report counts (all of it, when the cell reports fewer than twice)."""

    def __init__(self, steps: int | bool) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        self.limit = None if steps is True else int(steps)
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        plan = schedule(wait=0, warmup=1, active=self.limit, repeat=1) if self.limit else None
        self.prof = profile(activities=activities, schedule=plan)
        self.count = 0  # report() calls seen
        self.first = self.last = 0.0  # perf_counter() at the first and the latest of them
        # seconds waited for nbdist's loaders' batches: at the start, the first and latest step
        self.waited_start = self.waited_first = self.waited_last = waits.waited()
        with _quiet_stderr():
            self.prof.__enter__()
        self.origin = time.perf_counter()  # where the profiler's clock starts (whole cell)

    def step(self) -> None:
        if self.limit is not None and self.count > self.limit:
            return  # the window has closed
        now, waited = time.perf_counter(), waits.waited()
        if not self.first:
            self.first, self.waited_first = now, waited
        self.last, self.waited_last, self.count = now, waited, self.count + 1
        if self.limit is not None:
            with _quiet_stderr():  # the profiler starts (after the first step) and stops here
                self.prof.step()

    def finish(self) -> ProfileResult:
        ended = time.perf_counter()
        with _quiet_stderr():
            self.prof.__exit__(None, None, None)
        if self.count >= 2:  # whole steps, between the first and the last report
            steps, seconds = self.count - 1, self.last - self.first
            base = self.first if self.limit else self.origin  # the events' clock's zero
            lo, hi = (self.first - base) * 1e6, (self.last - base) * 1e6
            waited = self.waited_last - self.waited_first
        else:
            steps, seconds, lo, hi = max(1, self.count), ended - self.origin, -1e18, 1e18
            waited = waits.waited() - self.waited_start
        events = [e for e in self.prof.events() or [] if lo <= e.time_range.start <= hi]
        loading = sum(e.time_range.elapsed_us() for e in events if e.name.startswith(_DATA))
        collectives = sorted(
            (e.time_range.start, e.time_range.elapsed_us())
            for e in events
            if e.name.startswith(_COLLECTIVES)
            or ("nccl" in e.name.lower() and str(e.device_type).endswith("CUDA"))
        )
        return ProfileResult(
            steps=steps,
            seconds=seconds,
            data=max(loading / 1e6, waited),  # an nbdist loader's wait holds its DataLoader's
            collectives=tuple(d / 1e6 for _, d in collectives),
            trace=self._trace(),
        )

    def _trace(self) -> bytes | None:
        fd, path = tempfile.mkstemp(suffix=".json", prefix="nbdist-trace-")
        os.close(fd)
        try:
            self.prof.export_chrome_trace(path)
            with open(path, "rb") as f:
                packed = gzip.compress(f.read(), compresslevel=5)
        except Exception:  # no trace is no reason to lose the figures
            return None
        finally:
            os.unlink(path)
        return packed if len(packed) <= _MAX_TRACE else None


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """The profiler's C++ library writes a line to the process's stderr when it starts and stops
    (``USDT: ... profiler_start``), which the cell would show: for that moment, to /dev/null."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


_window: _Window | None = None


def start(steps: int | bool) -> None:
    """Profile this rank from now: for the whole cell (``True``) or its first ``steps``."""
    global _window
    _window = _Window(steps)
    on_step(_window.step)


def finish() -> ProfileResult | None:
    """Stop profiling; what the profiler saw (None if it was not running)."""
    global _window
    window, _window = _window, None
    on_step(None)
    if window is None:
        return None
    try:
        return window.finish()
    except Exception as e:  # the profile is lost, not the cell
        print(
            f"nbdist: the profile could not be read here ({type(e).__name__}: {e})", file=sys.stderr
        )
        return None
