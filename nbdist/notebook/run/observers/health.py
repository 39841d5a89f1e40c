"""Each rank's health in the run store, for the sidebar's tiles and the run's page: its state
(ok, slow, silent, then done, failed, stopped, dead), CPU, memory, GPU, step time, the shares of
its step in collectives and waiting for data, and how long since it was heard from. Written once
a second, at once when a rank dies, and at the end."""

from __future__ import annotations

from ....telemetry.events import WorkerHealth
from ....telemetry.writer import StoreWriter
from ...board.collector import Collector
from .base import Observer, RunEnd, Tick

_EVERY = 1.0  # seconds between writes


def rows(col: Collector, now: float) -> list[WorkerHealth]:
    """Each rank's health as the run store keeps it, at ``now``."""
    out = []
    for r, st in col.ranks.items():
        h = st.health
        out.append(
            WorkerHealth(
                rank=r,
                time=(h and h.time) or now,
                host=st.host,
                state=st.state,
                cpu=h and h.cpu,
                rss=h and h.rss,
                gpu_util=h and h.gpu_util,
                gpu_mem=h and h.gpu_mem,
                step_time=st.step_time,
                comm_share=h and h.comm_share,
                data_share=h and h.data_share,
                heartbeat_age=None if st.last_seen is None else now - st.last_seen,
                last_report_age=None if st.last_record is None else now - st.last_record,
                mesh=str(h.mesh) if h and h.mesh else None,
            )
        )
    return out


class HealthRows(Observer):
    """Writes every rank's health row of one run."""

    def __init__(self, writer: StoreWriter, run_id: int | None):
        self.writer = writer
        self.run_id = run_id
        self._last = 0.0

    def on_tick(self, tick: Tick) -> None:
        if tick.urgent or tick.now - self._last >= _EVERY:
            self._write(tick.live, tick.now)
        if tick.urgent:  # a rank died: the sidebar's tile shows it within a second
            self.writer.flush_soon()

    def on_end(self, end: RunEnd) -> None:
        if end.recorded:
            self._write(end.live, end.ended)

    def _write(self, col: Collector, now: float) -> None:
        if self.run_id is not None:
            self._last = now
            self.writer.put_health(self.run_id, rows(col, now))
