"""A run's numbers on their way to the trackers: ``TrackerFeed``, fed by the run's monitor.

The monitor hands over what the collector folds (each rank's records, each settled mean, every
event) and calls ``pump`` at its pace; once a second the feed sends one batch to every tracker:
the loss and every other metric per rank (``loss/rank1``) and their mean over ranks
(``loss/mean``), samples/s, each rank's health (``health/rank0/cpu``, ``rss_mb``, ``gpu_util``,
``gpu_mem_mb``) and a running count of each kind of event (``events/checkpoint``). A batch
holds the points of at most ``STEPS_PER_BATCH`` steps (evenly chosen, the latest kept), so a
tracker's calls and points stay bounded however often the ranks report. At the end, the run's
status, summary and events (as records) close each tracker run.
"""

from __future__ import annotations

import functools
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from ...telemetry.events import MetricRecord, RunEvent
from ...telemetry.series import metric_values
from . import sinks
from .sinks import Fanout, Point, RunInfo

INTERVAL = 1.0  # seconds between batches
STEPS_PER_BATCH = 20  # distinct steps a batch may carry
MAX_PENDING = 200_000  # points kept between two batches at most (thinned beyond)
MAX_EVENTS = 10_000  # events kept for the end of the run
_MB = 1024 * 1024


def run_info(
    name: str, run_id: int | None, options: Mapping[str, Any], label: str = "", started=0.0
) -> RunInfo:
    """How a tracker sees an nbdist run: named as the run (a sweep's trial: the sweep's name
    and the trial's label), its options as parameters, a trial's values as parameters of their
    own, grouped under its sweep."""
    values = options.get("values") or {}
    params = {k: _text(v) for k, v in options.items() if v is not None and k != "values"}
    params |= {str(k): _text(v) for k, v in values.items()}
    group = str(options.get("sweep") or "")
    shown = f"{name}: {label}" if label and name else name or label
    tags = {"nbdist.run_id": str(run_id)} if run_id is not None else {}
    if group:
        tags |= {"nbdist.sweep": group, "nbdist.trial": str(options.get("trial", ""))}
    return RunInfo(shown or f"nbdist run {run_id}", run_id, params, group, tags, started)


def _text(v: Any) -> Any:
    """A parameter's value: numbers and text as they are, a list as ``0,2``."""
    if isinstance(v, (list, tuple)):
        return ",".join(map(str, v))
    return v if isinstance(v, (int, float, str)) else str(v)


def thin(points: list[Point], steps: int) -> list[Point]:
    """The points at no more than ``steps`` distinct steps, evenly chosen, the latest kept."""
    seen = sorted({p.step for p in points})
    if len(seen) <= steps:
        return points
    keep = {seen[round(i * (len(seen) - 1) / (steps - 1))] for i in range(steps)}
    return [p for p in points if p.step in keep]


def event_row(e: RunEvent) -> dict:
    return {"time": e.time, "kind": e.kind, "rank": e.rank, "message": e.message, "data": e.data}


class TrackerFeed:
    """The trackers of one run, fed from the kernel's main thread without waiting on them."""

    def __init__(self, track: Iterable[str], run: RunInfo, fanout: Fanout | None = None):
        self.fanout = fanout or Fanout({n: functools.partial(sinks.make, n) for n in track}, run)
        self.pending: list[Point] = []
        self.events: list[dict] = []
        self.counts: Counter[str] = Counter()
        self._last = time.monotonic()

    # -- what the collector folds ------------------------------------------------------------
    def records(self, rank: int, recs: list[MetricRecord]) -> None:
        add = self.pending.append
        for rec in recs:
            if rec.step is not None:
                for name, v in metric_values(rec.loss, rec.extra).items():
                    add(Point(f"{name}/rank{rank}", int(rec.step), v, rec.time))
        if len(self.pending) > MAX_PENDING:
            self.pending = thin(self.pending, STEPS_PER_BATCH)

    def mean(self, name: str, step: float, value: float) -> None:
        self.pending.append(Point(f"{name}/mean", int(step), value, time.time()))

    def event(self, e: RunEvent) -> None:
        self.counts[e.kind] += 1
        if len(self.events) < MAX_EVENTS:
            self.events.append(event_row(e))

    # -- the kernel's pace -------------------------------------------------------------------
    def pump(self, collector: Any, force: bool = False) -> None:
        """Send what came since the last batch, once a second (or now, ``force``); print any
        tracker's warning under the cell."""
        now = time.monotonic()
        if force or now - self._last >= INTERVAL:
            self._last = now
            points, self.pending = thin(self.pending, STEPS_PER_BATCH), []
            self.fanout.log(points + self._state(collector))
        for text in self.fanout.take_warnings():
            print(text, file=sys.stderr, flush=True)

    def _state(self, col: Any) -> list[Point]:
        """samples/s, each rank's health and the events so far, at the run's current step."""
        step, now = col.done() or 0, time.time()
        out = [Point(f"events/{k}", step, float(n), now) for k, n in self.counts.items()]
        rate = col.samples_per_s()
        if rate is not None:
            out.append(Point("samples_per_s", step, rate, now))
        for r, st in col.ranks.items():
            h = st.health
            if h is None:
                continue
            for key, v, scale in (
                ("cpu", h.cpu, 1),
                ("rss_mb", h.rss, _MB),
                ("gpu_util", h.gpu_util, 1),
                ("gpu_mem_mb", h.gpu_mem, _MB),
            ):
                if v is not None:
                    out.append(Point(f"health/rank{r}/{key}", step, v / scale, now))
        return out

    def close(self, status: str, summary: Mapping[str, Any], collector: Any) -> None:
        """The last batch, then each tracker run ended with the run's status and summary."""
        self.pump(collector, force=True)
        numbers = {k: float(v) for k, v in summary.items() if isinstance(v, (int, float))}
        self.fanout.close(status, numbers, self.events)
        for text in self.fanout.take_warnings():
            print(text, file=sys.stderr, flush=True)
