"""The live dashboard under the cell (``board.dashboard.Dashboard``): shown at the first look
when the cell visibly reports (``report(`` in it, or ``--total``), else at its first report;
updated at the board's pace and at each change of phase; finished with the run, its profile
drawn when the cell had one. The board shows the last lines of the ranks whose output is not
printed under the cell."""

from __future__ import annotations

import time

from ....config import TelemetryConfig
from ....telemetry.events import MetricRecord, RunEvent
from ....telemetry.spread import MANY_RANKS, Spread
from ...board.collector import Collector
from ...board.dashboard import Dashboard
from ..output import shows_output_of
from .base import Observer, RunEnd, RunInfo, Tick

_LATENCIES = 100_000  # seconds from report() to the board, kept for the benchmark

_last: Board | None = None


def last() -> Board | None:
    """The board of this kernel's latest run that had one (tests and benchmarks look inside:
    ``last().dashboard.rows``, ``last().latencies``)."""
    return _last


class Board(Observer):
    """One run's live dashboard."""

    def __init__(self, info: RunInfo, cfg: TelemetryConfig):
        global _last
        _last = self
        self.cfg = cfg
        title = f"nbdist run {info.run_id}" if info.run_id is not None else "nbdist run"
        self.title = title + (f" ({info.name})" if info.name else "")
        first = info.ranks[0]
        self.log_ranks = frozenset(
            r for r in info.ranks if not shows_output_of(info.options, r, first)
        )
        self.show_early = bool(info.options.total or "report(" in info.source)
        self.dashboard: Dashboard | None = None
        self.events: list[RunEvent] = []
        self.latencies: list[float] = []  # seconds from a record's report() to the board
        self._pending: list[float] = []  # engine times of records not yet shown
        self.means: dict[str, tuple[float, float]] = {}  # metric -> its latest (step, mean)
        # many ranks: each metric's band over them and its outlier ranks, drawn instead of a
        # line per rank
        self.spread = Spread() if len(info.ranks) > MANY_RANKS else None

    def on_records(self, rank: int, records: list[MetricRecord]) -> None:
        self._pending.extend(rec.time for rec in records)
        if self.spread is not None:
            self.spread.add(rank, records)

    def on_mean(self, name: str, step: float, value: float) -> None:
        self.means[name] = (step, value)
        if self.spread is not None:
            self.spread.settle(name, step)

    def on_event(self, event: RunEvent) -> None:
        self.events.append(event)

    def on_tick(self, tick: Tick) -> None:
        col = tick.live
        if self.dashboard is None and (self.show_early or col.records):
            self._show(col)
        if self.dashboard is not None:
            self.dashboard.update(col, self.events, tick.status)
        self._note_latency()

    def on_end(self, end: RunEnd) -> None:
        if not end.recorded:
            return
        col = end.live
        if self.dashboard is None and col.records:
            self._show(col)
        if self.dashboard is not None:
            shown = end.profile.shown() if end.profile is not None else None
            self.dashboard.finish(col, self.events, end.status, end.ended, shown)
            self._note_latency()

    def _show(self, col: Collector) -> None:
        self.dashboard = Dashboard(self.title, self.cfg, self.log_ranks, self.means, self.spread)
        self.dashboard.show(col)

    def _note_latency(self) -> None:
        if self._pending and self.dashboard is not None:
            now = time.time()
            self.latencies.extend(now - t for t in self._pending)
            del self.latencies[:-_LATENCIES]
        self._pending.clear()
