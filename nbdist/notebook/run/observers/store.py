"""The run store's record of a run: its row, its metric records and events as they come, its
figures and summary once a second, its end (``telemetry.writer.StoreWriter``: SQLite, off the
main thread). The summary is each metric's last, least and greatest mean over ranks (folded
from the settled means: one step's mean each, not every rank's record): what the runs list
sorts by.

The row is written when the run is assembled (``start``), so every other output can name the
run by its id. A store that cannot be written costs one warning under the cell; training goes
on, unrecorded. A run that never reached the engines (a mistake in its options) is forgotten.
"""

from __future__ import annotations

import sys

from ....telemetry.events import MetricRecord, RunEvent
from ....telemetry.writer import StoreWriter
from .base import Observer, RunEnd, RunInfo, Tick

_SUMMARY_EVERY = 1.0  # seconds between writes of the run's figures (step, samples/s, loss)


def start(writer: StoreWriter, info: RunInfo) -> int | None:
    """Write the run's row now; its id (None when the store cannot be written)."""
    return writer.start_run(
        name=info.name,
        source=info.source,
        options=info.stored_options(),
        world_size=info.world_size,
        label=info.label,
        cluster_id=info.cluster_id,
        total=info.options.total,
        started=info.started,
    )


class RunRecord(Observer):
    """Keeps one run in the run store (its row made by ``start``)."""

    def __init__(self, writer: StoreWriter, run_id: int | None):
        self.writer = writer
        self.run_id = run_id
        self._last_summary = 0.0
        self._summary: dict[str, tuple[float, float, float]] = {}  # name -> last, min, max
        self._changed: set[str] = set()  # names whose summary is not written yet
        self._warned = False
        self._check()

    def on_records(self, rank: int, records: list[MetricRecord]) -> None:
        if self.run_id is not None:
            self.writer.add_metrics(self.run_id, rank, records)

    def on_event(self, event: RunEvent) -> None:
        if self.run_id is not None:
            self.writer.add_events(self.run_id, [event])

    def on_mean(self, name: str, step: float, value: float) -> None:
        _, low, high = self._summary.get(name, (value, value, value))
        self._summary[name] = (value, min(low, value), max(high, value))
        self._changed.add(name)

    def on_tick(self, tick: Tick) -> None:
        if self.run_id is not None and (
            tick.urgent or tick.now - self._last_summary >= _SUMMARY_EVERY
        ):
            self._last_summary = tick.now
            self.writer.update_run(self.run_id, **tick.live.summary())
            self._write_summary()
        if tick.urgent:  # a rank died: the sidebar shows it within a second
            self.writer.flush_soon()
        self._check()

    def on_end(self, end: RunEnd) -> None:
        if self.run_id is None:
            return
        if not end.recorded:
            self.writer.delete_run(self.run_id)
            return
        failures = [
            {"rank": f.rank, "summary": f.summary, "kind": f.kind, "at": f.at} for f in end.failures
        ]
        self.writer.update_run(self.run_id, **end.live.summary())
        self._write_summary()
        self.writer.end_run(self.run_id, end.status, failures, end.ended)

    def _write_summary(self) -> None:
        if self._changed and self.run_id is not None:
            self.writer.put_summary(self.run_id, {n: self._summary[n] for n in self._changed})
            self._changed = set()

    def _check(self) -> None:
        err = self.writer.error
        if err and not self._warned:
            self._warned = True
            print(
                f"nbdist: warning: the run store {self.writer.store.path} cannot be written "
                f"({err}); this run is not being recorded, training goes on.",
                file=sys.stderr,
                flush=True,
            )
