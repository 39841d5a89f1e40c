"""One run as the kernel watches it: what the ranks send, folded once, told to every observer.

``Watch`` is what the supervisor and the controller talk to. The supervisor hands it the ranks
at every look (``poll``: about 50 times a second while output flows, so it costs little) and
asks it which ranks passed the progress deadline (``hung_ranks``) and whether an observer asked
for the run to stop (``stop``); the controller tells it the run's phases and recovery's events.
The watch folds what arrived (``board.collector.Collector``) and tells each observer
(``base.Observer``) what the fold made: records as they come, events and settled means, and the
live state at the board's pace (the cell's ``--refresh``, as the ranks send), at once when a
rank dies or the phase changes. A rank is silent after a few periods of that pace at least.
``close`` ends it: every observer is told how the run ended, once, then what
the assembly opened for them (the run store's writer) is closed. The interrupt button never lands
halfway through any of these (``interrupts.held``).

``last()`` is the latest run of this kernel (tests and benchmarks look inside it).
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ....config import TelemetryConfig
from ....errors import RankFailure
from ....telemetry import events as ev
from ....telemetry.events import RunEvent
from ...board.collector import Collector, RankFeed
from ...board.health import quiet_for
from ...debug import profile
from ..interrupts import holding
from .base import Observer, Phase, RunEnd, RunInfo, Stop, Tick

_last: Watch | None = None


def last() -> Watch | None:
    """The watch of this kernel's latest run (finished or not), or None."""
    return _last


class Watch:
    """One run's collector and observers (see the module's text)."""

    def __init__(
        self,
        info: RunInfo,
        observers: Iterable[Observer],
        cfg: TelemetryConfig | None = None,
        stop: Stop | None = None,
        closers: Iterable[Callable[[], None]] = (),
    ):
        global _last
        self.info = info
        pace = info.options.refresh
        cfg = cfg or TelemetryConfig()  # silent: no news for a few of the ranks' periods
        self.cfg = dataclasses.replace(cfg, silent_after=max(cfg.silent_after, 3 * pace))
        self.pace = pace
        self.collector = Collector(
            list(info.ranks), self.cfg, total=info.options.total, started=info.started
        )
        self.observers = list(observers)
        self.stop = stop or Stop()
        self.status = "running"  # running or recovering; then how the run ended
        self.events: list[RunEvent] = []  # every event of the run, in order
        self.closed = False
        # time spent in each of the latest polls (for the benchmark): bounded, as runs are not
        self.poll_seconds: deque[float] = deque(maxlen=100_000)
        self._closers = list(closers)
        self._last_tick = 0.0
        _last = self

    @property
    def run_id(self) -> int | None:
        return self.info.run_id

    def find(self, kind: type) -> Any:
        """This run's observer of type ``kind``, or None (tests and benchmarks look inside)."""
        return next((o for o in self.observers if isinstance(o, kind)), None)

    # -- what the supervisor asks -----------------------------------------------------------
    @holding
    def poll(self, ranks: Mapping[int, RankFeed]) -> None:
        """Fold what the ranks sent; tell the observers; the live state when due (at once when
        a rank just died: the cell may end before the next pace, and the sidebar shows it)."""
        t0 = time.perf_counter()
        col = self.collector
        col.poll(ranks)
        self._tell()
        died = any(st.outcome == ev.DEAD and st.state != ev.DEAD for st in col.ranks.values())
        if died or col.clock() - self._last_tick >= self.pace:
            self.tick(urgent=died)
        self.poll_seconds.append(time.perf_counter() - t0)

    def hung_ranks(self, timeout: float) -> list[int]:
        """Ranks past the progress deadline: they reported steps in this attempt, then none for
        ``timeout`` s (measured on their own clocks). The supervisor kills them; recovery
        replaces them."""
        now = self.collector.clock()
        return [
            r
            for r, st in self.collector.ranks.items()
            if st.outcome is None
            and st.last_record is not None
            and quiet_for(st, now, now) > timeout
        ]

    # -- what the controller tells ----------------------------------------------------------
    @holding
    def on_phase(self, old: Phase, new: Phase) -> None:
        """Entering and leaving recovery are events (the run's end has its own); the live state
        goes out at once (no poll runs during recovery)."""
        if Phase.RECOVERING in (old, new):
            data = {"old": old.value, "new": new.value}
            self.on_event("phase", None, f"{old.value} -> {new.value}", data)
        if not new.terminal:
            self.status = new.value
            self.tick()

    @holding
    def on_event(self, kind: str, rank: int | None, message: str, data: Mapping[str, Any]) -> None:
        """An event of this run (recovery's, a sweep's): kept, and told to every observer."""
        self._told(RunEvent(time.time(), str(kind), rank, str(message), dict(data) or None))

    # -- telling ------------------------------------------------------------------------------
    @holding
    def tick(self, urgent: bool = False) -> None:
        """Judge the ranks, settle the means, and tell every observer the live state."""
        col = self.collector
        self._last_tick = col.clock()
        col.update_states()
        col.settle_mean()
        self._tell()
        tick = Tick(col, self.status, time.time(), urgent)
        for obs in self.observers:
            obs.on_tick(tick)

    def _tell(self) -> None:
        news = self.collector.take_news()
        if not news:
            return
        for rank, records in news.records:
            for obs in self.observers:
                obs.on_records(rank, records)
        for e in news.events:
            self._told(e)
        for name, step, value in news.means:
            for obs in self.observers:
                obs.on_mean(name, step, value)

    def _told(self, e: RunEvent) -> None:
        self.events.append(e)
        for obs in self.observers:
            obs.on_event(e)

    # -- the end ------------------------------------------------------------------------------
    @holding
    def close(
        self, status: str, failures: Iterable[RankFailure] = (), recorded: bool = True
    ) -> None:
        """End the run: each rank's final state, the end event, every observer told how it
        ended (once; a second close does nothing), then what was opened for them closed."""
        if self.closed:
            return
        self.closed = True
        col = self.collector
        self.status = status
        for st in col.ranks.values():  # still going when the run ended: stopped by its end
            if st.outcome is None:
                st.outcome = ev.DONE if status == "ok" else ev.STOPPED
        col.update_states()
        col.settle_mean(final=True)
        self._tell()
        end = RunEnd(status, time.time(), col, tuple(failures), _profile(col), recorded)
        self.on_event("finished" if status == "ok" else status, None, end.message(), {})
        try:
            for obs in self.observers:
                obs.on_end(end)
        finally:
            for close in self._closers:
                close()


def _profile(col: Collector) -> profile.Profile | None:
    """The ranks' profiles read together (``--profile``), or None."""
    results = {r: st.profile for r, st in col.ranks.items() if st.profile}
    return profile.read(results) if results else None
