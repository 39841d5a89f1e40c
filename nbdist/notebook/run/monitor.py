"""The live side of a ``%%distributed`` run: ``RunMonitor`` watches it while it goes.

``RunMonitor`` is the run's observer (``observers.RunObserver``): the controller tells it the
run's phases and recovery's events, and the supervisor hands it the ranks at every poll. It
feeds the collector, the dashboard, the run store, TensorBoard and the experiment trackers
(``notebook.trackers``), and keeps the run's events.
Other parts of nbdist add their own events through ``active()``::

    from nbdist.notebook import monitor
    mon = monitor.active()          # the run in progress, or None
    if mon is not None:
        mon.on_event("restart", 1, "fresh engine", {"attempt": 2})

Kept runs are read back with ``board.runs`` (``nbdist.runs()``, ``nbdist.compare()``).
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from ...config import CellOptions, TelemetryConfig
from ...errors import DistributedCellError, RankFailure, UsageError
from ...telemetry import events as ev
from ...telemetry.events import MetricRecord, RunEvent, WorkerHealth
from ...telemetry.format import fmt_duration
from ...telemetry.store import RunStore
from ...telemetry.writer import StoreWriter
from ..board.collector import Collector, RankFeed, quiet_for
from ..debug import profile
from ..debug.profile import Profile
from ..trackers import sinks
from ..trackers.live import TrackerFeed, run_info
from .observers import Phase
from .supervisor import shows_output_of

_active: RunMonitor | None = None
_last: RunMonitor | None = None


def active() -> RunMonitor | None:
    """The monitor of the run in progress in this kernel, or None."""
    return _active


def last() -> RunMonitor | None:
    """The monitor of the latest run in this kernel (finished or not), or None."""
    return _last


class _StopRun(KeyboardInterrupt):
    """Raised inside the supervisor's poll to stop every rank (it handles it as an interrupt)."""


class RunMonitor:
    """Watches one run: collector, dashboard, run store, TensorBoard, trackers, and events.

    Use as a context manager around ``Cluster.run``, and pass it as one of the run's observers.
    """

    def __init__(
        self,
        cluster: Any,
        source: str,
        opts: CellOptions,
        *,
        name: str = "",
        label: str = "",
        world_size: int | None = None,
        dashboard: bool = True,
        total: int | None = None,
        tensorboard: str | None = None,
        stop_on_nan: bool = False,
        store: RunStore | None = None,
        cfg: TelemetryConfig | None = None,
        track: Any = None,
    ):
        self.cfg = cfg or TelemetryConfig()
        ranks = list(opts.ranks) if opts.ranks is not None else [s.rank for s in cluster.slots]
        # one start and (at close) one end, so the run's length reads the same everywhere
        self.started = time.time()
        self.collector = Collector(ranks, self.cfg, total=total, started=self.started)
        self.collector.on_records = self._on_records
        self.collector.on_event = self._record
        # the board shows the last lines of the ranks whose output is not printed under the cell
        self.log_ranks = frozenset(r for r in ranks if not shows_output_of(opts, r, ranks[0]))
        self.name = name
        self.phase = Phase.STARTING
        self.status = "running"  # what the dashboard shows: running, recovering, then the end
        self.events: list[RunEvent] = []
        self.stop_on_nan = stop_on_nan
        self.stop_reason: RankFailure | None = None
        self._stop_raised = False
        self.want_dashboard = dashboard
        self.dashboard = None
        self.latencies: list[float] = []  # seconds from report() to the widget's state
        # time spent in each of the latest polls (for the benchmark): bounded, as runs are not
        self.poll_seconds: deque[float] = deque(maxlen=100_000)
        self._last_ui = 0.0
        self._last_health_write = 0.0
        self._warned = False
        sinks.check(track := sinks.names(track))  # a missing package: one line, before the run
        self.tb = _tensorboard(tensorboard) if tensorboard else None
        if self.tb is not None or track:
            self.collector.series.on_mean = self._on_mean
        self.writer = StoreWriter(store or RunStore(), self.cfg.store_interval)
        # every cell option, whatever CellOptions holds now (extra: the telemetry options)
        options = {k: v for k, v in vars(opts).items() if k != "extra"} | dict(opts.extra)
        self.run_id = self.writer.start_run(
            name=name,
            source=source,
            options=options,
            world_size=world_size or len(cluster.slots),
            label=label,
            cluster_id=str(getattr(cluster.engines, "cluster_id", "") or ""),
            total=total,
            started=self.started,
        )
        info = run_info(name, self.run_id, options, label, self.started)
        self.trackers = TrackerFeed(track, info) if track else None  # MLflow, W&B, Comet
        self._check_store()
        # A cell that visibly reports gets its dashboard at its first poll (above its output);
        # others when their first report arrives.
        self._show_early = dashboard and bool(total or "report(" in source)

    # -- context ----------------------------------------------------------------------------
    def __enter__(self) -> RunMonitor:
        global _active, _last
        _active = _last = self
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        global _active
        _active = None
        failures: list[dict] = []
        if exc_type is None:
            status = "ok"
        elif self.stop_reason is not None:
            status = "stopped"
        elif issubclass(exc_type, KeyboardInterrupt):
            status = "interrupted"
        else:
            status = "failed"
        if isinstance(exc, UsageError) and not self.collector.batches:  # never reached engines
            if self.run_id is not None:
                self.writer.delete_run(self.run_id)
            self.writer.close()
            if self.trackers is not None:
                self.trackers.close("failed", {}, self.collector)
            return False
        if isinstance(exc, DistributedCellError):
            failures = [
                {"rank": f.rank, "summary": f.summary, "kind": f.kind} for f in exc.failures
            ]
        self.close(status, failures)
        if self.stop_reason is not None and exc_type is not None:
            raise DistributedCellError([self.stop_reason], "nbdist: stopped by --stop-on-nan")
        return False

    def close(self, status: str, failures: list[dict] | None = None) -> None:
        """End the run: each rank's final state, the final dashboard (with its picture) and
        rows, the run's status; its end time is taken once, here, for all of them."""
        ended = time.time()
        self.status = status
        col = self.collector
        for st in col.ranks.values():  # still going when the run ended: stopped by its end
            if st.outcome is None:
                st.outcome = ev.DONE if status == "ok" else ev.STOPPED
        col.update_states()
        col.settle_mean(final=True)
        message = f"{status} after {fmt_duration(ended - self.started)}"
        cause = next((f for f in failures or () if not _bystander(f)), None)
        if cause is not None:
            message += f": rank {cause['rank']}: {cause['summary']}"
        self.on_event("finished" if status == "ok" else status, None, message, {})
        if self.dashboard is None and self.want_dashboard and col.records:
            self._show()
        profiled = self._profile()
        if self.dashboard is not None:
            self.dashboard.finish(col, self.events, status, ended, profiled and profiled.shown())
            self._note_latency()
        self._write_health(force=True)
        if self.run_id is not None:
            self.writer.update_run(self.run_id, **self._summary())
            self.writer.end_run(self.run_id, status, failures or [], ended)
        self.writer.close()
        if self.tb is not None:
            self.tb.close()
        if self.trackers is not None:  # last: it may wait (bounded) for slow trackers
            self.trackers.close(status, self._summary(), col)
        self._check_store()

    # -- the run's observer (observers.RunObserver) -------------------------------------------
    def on_poll(self, ranks: Mapping[int, RankFeed]) -> None:
        """Take what the ranks sent; update the dashboard and the store when due."""
        t0 = time.perf_counter()
        col = self.collector
        col.poll(ranks)
        # A rank that just died is judged, written and flushed at once, whatever the pace of
        # updates: the cell may end before the next one, and the sidebar shows it within 1 s.
        if any(st.outcome == ev.DEAD and st.state != ev.DEAD for st in col.ranks.values()):
            col.update_states()
            self._write_health(force=True)
            self.writer.flush_soon()
        if self._show_early and self.dashboard is None:
            self._show()
        now = col.clock()
        if now - self._last_ui >= self.cfg.ui_interval:
            self._last_ui = now
            col.update_states()
            col.settle_mean()
            if self.dashboard is None and self.want_dashboard and col.records:
                self._show()
            if self.dashboard is not None:
                self.dashboard.update(col, self.events, self.status)
            self._note_latency()
            self._write_health()
            self._check_store()
            if self.trackers is not None:
                self.trackers.pump(col)
        self.poll_seconds.append(time.perf_counter() - t0)
        if self.stop_reason is not None and not self._stop_raised:
            self._stop_raised = True
            raise _StopRun("nbdist: stopping every rank (--stop-on-nan)")

    def on_phase(self, old: Phase, new: Phase) -> None:
        """Show the run's phase on the dashboard at once (no poll runs during recovery); keep
        entering and leaving recovery as ``phase`` events (the run's end has its own)."""
        self.phase = new
        if Phase.RECOVERING in (old, new):
            self.on_event(
                "phase", None, f"{old.value} -> {new.value}", {"old": old.value, "new": new.value}
            )
        if not new.terminal:
            self.status = new.value
            if self.dashboard is not None:
                self.dashboard.update(self.collector, self.events, self.status)

    def on_event(self, kind: str, rank: int | None, message: str, data: Mapping[str, Any]) -> None:
        """Record an event of this run: shown on the dashboard, kept in the run store."""
        self._record(RunEvent(time.time(), str(kind), rank, str(message), dict(data) or None))

    def hung_ranks(self, timeout: float) -> list[int]:
        """Ranks past the progress deadline: they reported steps, then none for ``timeout`` s
        (measured on their own clocks). The supervisor kills them; recovery replaces them."""
        now = self.collector.clock()
        return [
            r
            for r, st in self.collector.ranks.items()
            if st.outcome is None and st.reports and quiet_for(st, now, now) > timeout
        ]

    def _profile(self) -> Profile | None:
        """A cell under --profile: the ranks' profiles read together, shown under the cell, the
        merged trace in the run's folder (``debug.profile``)."""
        results = {r: st.profile for r, st in self.collector.ranks.items() if st.profile}
        if not results:
            return None
        try:
            folder = profile.folder_of(self.run_id)
        except (UsageError, OSError) as e:
            print(f"nbdist: the trace is not kept ({e})", file=sys.stderr)
            folder = None
        profiled = profile.summarize(results, folder)
        print(profiled.text(), flush=True)
        return profiled

    # -- the dashboard ------------------------------------------------------------------------
    def _show(self) -> None:
        from ..board.dashboard import Dashboard

        title = f"nbdist run {self.run_id}" if self.run_id is not None else "nbdist run"
        self.dashboard = Dashboard(
            title + (f" ({self.name})" if self.name else ""), self.cfg, self.log_ranks
        )
        self.dashboard.show(self.collector)

    def _note_latency(self) -> None:
        col = self.collector
        if col.pending:
            now = time.time()
            self.latencies.extend(now - t for t in col.pending)
            col.pending.clear()
            del self.latencies[:-100_000]

    # -- events and rows ------------------------------------------------------------------------
    def _record(self, e: RunEvent) -> None:
        """Keep ``e`` (from the collector or from ``on_event``); a NaN loss may stop the run."""
        self.events.append(e)
        if self.run_id is not None:
            self.writer.add_events(self.run_id, [e])
        if self.tb is not None:
            self.tb.add_text("events", f"{e.kind} rank {e.rank}: {e.message}")
        if self.trackers is not None:
            self.trackers.event(e)
        if e.kind == "nan" and self.stop_on_nan and self.stop_reason is None:
            self.stop_reason = RankFailure(
                e.rank,
                f"loss is not finite: {e.message} (stopped by --stop-on-nan)",
                at=time.time(),
                kind="error",
            )

    def _on_records(self, rank: int, recs: list[MetricRecord]) -> None:
        if self.run_id is not None:
            self.writer.add_metrics(self.run_id, rank, recs)
        if self.trackers is not None:
            self.trackers.records(rank, recs)
        if self.tb is not None:
            for rec in recs:
                if rec.step is None:
                    continue
                if rec.loss is not None:
                    self.tb.add_scalar(f"loss/rank{rank}", rec.loss, rec.step, walltime=rec.time)
                for k, v in (rec.extra or {}).items():
                    self.tb.add_scalar(f"{k}/rank{rank}", v, rec.step, walltime=rec.time)

    def _on_mean(self, name: str, step: float, value: float) -> None:
        """A newly settled point of the mean of ``name`` over ranks: TensorBoard's, trackers'."""
        if self.tb is not None:
            self.tb.add_scalar(f"{name}/mean", value, step)
        if self.trackers is not None:
            self.trackers.mean(name, step, value)

    def _write_health(self, force: bool = False) -> None:
        now = time.time()
        if self.run_id is None or (not force and now - self._last_health_write < 1.0):
            return
        self._last_health_write = now
        rows = []
        for r, st in self.collector.ranks.items():
            h = st.health
            rows.append(
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
                    heartbeat_age=None if st.last_seen is None else now - st.last_seen,
                    last_report_age=None if st.last_record is None else now - st.last_record,
                    mesh=str(h.mesh) if h and h.mesh else None,
                )
            )
        self.writer.put_health(self.run_id, rows)
        self.writer.update_run(self.run_id, **self._summary())
        if self.tb is not None:
            rate = self.collector.samples_per_s()
            if rate is not None:
                self.tb.add_scalar("samples_per_s", rate, self.collector.done() or 0)

    def _summary(self) -> dict:
        col = self.collector
        out = {"step": col.done(), "samples_per_s": col.samples_per_s()}
        if col.total:
            out["total"] = col.total
        bad = [st for st in col.ranks.values() if st.nonfinite]
        loss = float(bad[0].nonfinite) if bad else col.mean_loss()
        if loss is not None:
            out["loss"] = loss
        return out

    def _check_store(self) -> None:
        err = self.writer.error
        if err and not self._warned:
            self._warned = True
            print(
                f"nbdist: warning: the run store {self.writer.store.path} cannot be written "
                f"({err}); this run is not being recorded, training goes on.",
                file=sys.stderr,
                flush=True,
            )


def _bystander(failure: Mapping[str, Any]) -> bool:
    return RankFailure(failure["rank"], failure["summary"], kind=failure["kind"]).bystander


def _tensorboard(logdir: str) -> Any:
    """A TensorBoard SummaryWriter (torch's: torch is imported only with ``--tensorboard``)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception:
        raise UsageError(
            "--tensorboard needs the tensorboard package: pip install tensorboard"
        ) from None
    try:
        return SummaryWriter(log_dir=logdir)
    except OSError as e:
        raise UsageError(f"--tensorboard: cannot write to {logdir!r} ({e.strerror})") from None
