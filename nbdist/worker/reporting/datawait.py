"""How long a rank waits for its batches: the data share each health sample carries.

``timed(batches)`` wraps a loader's iterator (``nbdist.loader``'s, and any loader of nbdist's)
and times each ``next()`` on it: two clock reads and a few stores per batch, on the thread that
trains. A step runs from one batch handed out to the next, so its wait (the ``next()`` that ended
it) is at its end, and a window of whole steps is shared fairly: ``share()``, read by the health
sampler (``health``), is the seconds waited over the seconds of the steps ended since its
previous reading. While no step ends (a step longer than the window) it is the share of the step
so far when the rank waits for a batch now, else the last share read. None when no timed loader
handed out a batch in the cell (``begin_cell`` starts afresh).

Only the main thread's iteration counts (a loader prefetched on a thread of its own is no wait of
the step), and a timed iterator inside another counts nothing (the outer one does).
``waited()``: every second waited in the cell, for ``--profile``'s window.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


class Waits:
    """This engine's counts, written by the training thread as batches come, read by the
    health sampler's thread: what both read of a step is one tuple, replaced whole."""

    def __init__(self) -> None:
        self.begin_cell()

    def begin_cell(self) -> None:
        """A cell starts (main thread): its counts are its own."""
        # seconds waited, seconds of whole steps, steps, perf_counter() at the latest batch
        self.totals: tuple[float, float, int, float | None] = (0.0, 0.0, 0, None)
        self.since: float | None = None  # when the next() in progress began
        self.pending = 0.0  # waits of the open step that handed out nothing (an iterator's end)
        self.busy = False  # inside a timed next(): an inner timed iterator counts nothing
        self.seen: tuple[float, float, int] = (0.0, 0.0, 0)  # the totals at the last share()
        self.last: float | None = None  # the latest whole steps' share

    def share(self, now: float | None = None) -> float | None:
        """The share of the steps since the previous call spent waiting for a batch (sampler's
        thread; ``now``: ``perf_counter()``'s, for tests)."""
        since = self.since
        waited, stepped, steps, handed = self.totals
        w0, s0, n0 = self.seen
        self.seen = (waited, stepped, steps)
        if steps > n0 and stepped > s0:
            self.last = _unit((waited - w0) / (stepped - s0))
            return self.last
        if since is not None and (handed is None or since >= handed):  # waiting now
            now = time.perf_counter() if now is None else now
            opened = since if handed is None else handed  # the open step began
            if now > opened:
                return _unit((now - since + self.pending) / (now - opened))
        return self.last

    def waited(self) -> float:
        """Seconds waited for batches in this cell so far."""
        return self.totals[0] + self.pending


#: This engine's counts (``timed`` adds to them; ``health`` reads them).
waits = Waits()


def timed(batches: Iterable[T]) -> Iterator[T]:
    """``batches``' iterator, each ``next()`` on it timed as waiting for data (see the module's
    text). The iterator is made at once, so a loader's own errors come from ``iter()``."""
    return _timed(iter(batches), threading.main_thread().ident)


def _timed(it: Iterator[T], main: int | None) -> Iterator[T]:
    w, clock, ident = waits, time.perf_counter, threading.get_ident
    while True:
        if w.busy or ident() != main:  # an outer timed iterator, or no step's thread, counts
            try:
                batch = next(it)
            except StopIteration:
                return
            yield batch
            continue
        start = w.since = clock()
        w.busy = True
        try:
            batch = next(it)
        except StopIteration:
            w.pending += clock() - start
            return
        finally:
            w.busy = False
            w.since = None
        end = clock()
        waited, stepped, steps, handed = w.totals
        wait = end - start + w.pending
        w.pending = 0.0
        w.totals = (
            waited + wait,
            stepped + (wait if handed is None else end - handed),
            steps + 1,
            end,
        )
        yield batch


def _unit(x: float) -> float:
    return 0.0 if x < 0.0 else 1.0 if x > 1.0 else x
