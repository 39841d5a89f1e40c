"""The experiment trackers (``--track mlflow,wandb,comet``): the run's numbers as the run store
has them, sent on the trackers' own threads (``trackers.live.TrackerFeed``), never holding up the
collector or the training. A sweep's trials are tracker runs grouped under the sweep."""

from __future__ import annotations

from ....telemetry.events import MetricRecord, RunEvent
from ...trackers.live import TrackerFeed, run_info
from .base import Observer, RunEnd, RunInfo, Tick


class Trackers(Observer):
    """One run's tracker runs, one per ``--track`` name."""

    def __init__(self, info: RunInfo):
        about = run_info(info.name, info.run_id, info.stored_options(), info.label, info.started)
        self.feed = TrackerFeed(info.options.track, about)

    def on_records(self, rank: int, records: list[MetricRecord]) -> None:
        self.feed.records(rank, records)

    def on_mean(self, name: str, step: float, value: float) -> None:
        self.feed.mean(name, step, value)

    def on_event(self, event: RunEvent) -> None:
        self.feed.event(event)

    def on_tick(self, tick: Tick) -> None:
        self.feed.pump(tick.live)

    def on_end(self, end: RunEnd) -> None:  # last: it may wait (bounded) for slow trackers
        summary = end.live.summary() if end.recorded else {}
        self.feed.close(end.status, summary, end.live)
