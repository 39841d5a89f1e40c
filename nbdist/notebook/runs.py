"""Every ``%%distributed`` run, watched while it goes and kept afterwards.

``RunMonitor`` watches one run: it is the supervisor's observer (``Cluster.run(...,
observers=[monitor])``), feeds the collector, the dashboard, the run store and TensorBoard, and
records events. Other parts of nbdist add their own events through ``active()``::

    from nbdist.notebook import runs
    monitor = runs.active()          # the run in progress, or None
    if monitor is not None:
        monitor.event("restart", rank=1, message="fresh engine", attempt=2)

``runs()`` lists the kept runs, ``Run.metrics()`` returns one run's metrics (plain data, or a
pandas DataFrame), ``compare(a, b, ...)`` plots their loss curves together.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..config import TelemetryConfig
from ..errors import DistributedCellError, RankFailure, UsageError
from ..telemetry import events as ev
from ..telemetry.store import RunStore, StoreWriter
from .collector import Collector, _quiet_for

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
    """Watches one run: collector, dashboard, run store, TensorBoard, and the run's events.

    Use as a context manager around ``Cluster.run``; pass the monitor as an observer.
    ``event(kind, rank=None, message="", **data)`` records an event from anywhere in nbdist.
    """

    def __init__(self, cluster, source: str, opts, *, name: str = "", dashboard: bool = True,
                 total: int | None = None, tensorboard: str | None = None,
                 stop_on_nan: bool = False, store: RunStore | None = None,
                 cfg: TelemetryConfig | None = None):
        self.cfg = cfg or TelemetryConfig()
        ranks = list(opts.ranks) if opts.ranks is not None else [s.rank for s in cluster.slots]
        self.collector = Collector(ranks, self.cfg, total=total)
        self.collector.on_records = self._on_records
        self.collector.on_event = self._on_collector_event
        self.collector.on_health = self._on_health
        self.name = name
        self.status = "running"
        self.events: list[dict] = []
        self.stop_on_nan = stop_on_nan
        self.stop_reason: RankFailure | None = None
        self._stop_raised = False
        self.want_dashboard = dashboard
        self.dashboard = None
        self.latencies: list[float] = []  # seconds from report() to the widget's state
        self.poll_seconds: list[float] = []  # time spent in each poll (for the benchmark)
        self._last_ui = 0.0
        self._last_health_write = 0.0
        self._health_rows: dict[int, dict] = {}
        self._warned = False
        self.tb = _tensorboard(tensorboard) if tensorboard else None
        self.writer = StoreWriter(store or RunStore(), self.cfg.store_interval)
        options = {"timeout": opts.timeout, "ranks": opts.ranks, "all_output": opts.all_output,
                   **opts.extra}
        self.run_id = self.writer.start_run(
            name=name, source=source, options=options, world_size=len(cluster.slots),
            cluster_id=str(getattr(cluster.engines, "cluster_id", "") or ""), total=total)
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
                self.writer.put("delete_run", self.run_id)
            self.writer.close()
            return False
        if isinstance(exc, DistributedCellError):
            failures = [{"rank": f.rank, "summary": f.summary, "kind": f.kind}
                        for f in exc.failures]
        self.close(status, failures)
        if self.stop_reason is not None and exc_type is not None:
            raise DistributedCellError([self.stop_reason], "nbdist: stopped by --stop-on-nan")
        return False

    def close(self, status: str, failures: list[dict] | None = None) -> None:
        """End the run: final dashboard (with its picture), final rows, the run's status."""
        self.status = status
        col = self.collector
        for st in col.ranks.values():
            if st.outcome is None:
                st.outcome = "ok" if status == "ok" else "failed"
        col.update_states()
        self.event("finished" if status == "ok" else status, None,
                   f"{status} after {time.time() - col.started:.1f} s")
        if self.dashboard is None and self.want_dashboard and col.records:
            self._show()
        if self.dashboard is not None:
            self.dashboard.finish(col, self.events, status)
            self._note_latency()
        self._write_health(force=True)
        if self.run_id is not None:
            self.writer.put("update_run", self.run_id, **self._summary(final=True))
            self.writer.put("end_run", self.run_id, status, failures or [])
        self.writer.close()
        if self.tb is not None:
            self.tb.close()
        self._check_store()

    # -- the supervisor's observer ----------------------------------------------------------
    def __call__(self, ranks: dict) -> None:
        t0 = time.perf_counter()
        col = self.collector
        col.poll(ranks)
        if self._show_early and self.dashboard is None:
            self._show()
        now = col.clock()
        if now - self._last_ui >= self.cfg.ui_interval:
            self._last_ui = now
            col.update_states()
            if self.dashboard is None and self.want_dashboard and col.records:
                self._show()
            if self.dashboard is not None:
                self.dashboard.update(col, self.events, self.status)
            self._note_latency()
            self._write_health()
            self._check_store()
        self.poll_seconds.append(time.perf_counter() - t0)
        if self.stop_reason is not None and not self._stop_raised:
            self._stop_raised = True
            raise _StopRun("nbdist: stopping every rank (--stop-on-nan)")

    def _show(self) -> None:
        from .dashboard import Dashboard

        title = f"nbdist run {self.run_id}" if self.run_id is not None else "nbdist run"
        self.dashboard = Dashboard(title + (f" ({self.name})" if self.name else ""), self.cfg)
        self.dashboard.show()

    def _note_latency(self) -> None:
        col = self.collector
        if col.pending:
            now = time.time()
            self.latencies.extend(now - t for t in col.pending)
            col.pending.clear()
            del self.latencies[:-100_000]

    # -- events and rows --------------------------------------------------------------------
    def hung_ranks(self, timeout: float) -> list[int]:
        """Ranks past the progress deadline: they reported steps, then none for ``timeout`` s
        (measured on their own clocks). The supervisor kills them; recovery replaces them."""
        now = self.collector.clock()
        return [
            r
            for r, st in self.collector.ranks.items()
            if st.outcome is None and st.reports and _quiet_for(st, now, now) > timeout
        ]

    def event(self, kind: str, rank: int | None = None, message: str = "", **data) -> None:
        """Record an event of this run: shown on the dashboard, kept in the run store."""
        self._event(kind, rank, message, data, None)

    def _event(self, kind: str, rank, message: str, data: dict, at: float | None) -> None:
        e = {"time": at or time.time(), "kind": str(kind), "rank": rank,
             "message": str(message), "data": data or None}
        self.events.append(e)
        if self.run_id is not None:
            self.writer.put("add_events", self.run_id, [e])
        if self.tb is not None:
            self.tb.add_text("events", f"{kind} rank {rank}: {message}")

    def _on_collector_event(self, kind, rank, message, data, at) -> None:
        self._event(kind, rank, message, data, at)
        if kind == "nan" and self.stop_on_nan and self.stop_reason is None:
            self.stop_reason = RankFailure(
                rank, f"loss is not finite: {message} (stopped by --stop-on-nan)",
                at=time.time(), kind="error")

    def _on_records(self, rank: int, recs: list) -> None:
        if self.run_id is not None:
            self.writer.put("add_metrics", self.run_id, [ev.metric_dict(r, rank) for r in recs])
        if self.tb is not None:
            for t, step, loss, _samples, _total, extra in recs:
                if step is None:
                    continue
                if loss is not None:
                    self.tb.add_scalar(f"loss/rank{rank}", loss, step, walltime=t)
                for k, v in (extra or {}).items():
                    self.tb.add_scalar(f"{k}/rank{rank}", v, step, walltime=t)

    def _on_health(self, rank: int, sample: dict) -> None:
        self._health_rows[rank] = sample

    def _write_health(self, force: bool = False) -> None:
        now = time.time()
        if self.run_id is None or (not force and now - self._last_health_write < 1.0):
            return
        self._last_health_write = now
        rows = []
        for r, st in self.collector.ranks.items():
            h = self._health_rows.get(r) or {}
            rows.append({
                "rank": r, "time": h.get("time") or now, "host": st.host, "state": st.state,
                "cpu": h.get("cpu"), "rss": h.get("rss"), "gpu_util": h.get("gpu_util"),
                "gpu_mem": h.get("gpu_mem"), "step_time": st.step_time,
                "comm_share": h.get("comm_share"),
                "heartbeat_age": None if st.last_seen is None else now - st.last_seen,
                "last_report_age": None if st.last_record is None else now - st.last_record,
            })
        self.writer.put("put_health", self.run_id, rows)
        self.writer.put("update_run", self.run_id, **self._summary())
        if self.tb is not None:
            mean = self.collector.mean_series()
            for s, v in zip(mean.steps, mean.values, strict=True):
                if s > self._tb_mean:
                    self.tb.add_scalar("loss/mean", v, s)
            self._tb_mean = max(mean.steps, default=self._tb_mean)
            rate = self.collector.samples_per_s()
            if rate is not None:
                self.tb.add_scalar("samples_per_s", rate, self.collector.done() or 0)

    _tb_mean = -1

    def _summary(self, final: bool = False) -> dict:
        col = self.collector
        out = {"step": col.done(), "samples_per_s": col.samples_per_s()}
        if col.total:
            out["total"] = col.total
        bad = [st for st in col.ranks.values() if st.nonfinite]
        mean = col.mean_series(final=final).values
        loss = float(bad[0].nonfinite) if bad else (mean[-1] if mean else None)
        if loss is not None:
            out["loss"] = loss
        return out

    def _check_store(self) -> None:
        err = self.writer.error
        if err and not self._warned:
            self._warned = True
            print(f"nbdist: warning: the run store {self.writer.store.path} cannot be written "
                  f"({err}); this run is not being recorded, training goes on.",
                  file=sys.stderr, flush=True)


def _tensorboard(logdir: str):
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


# -- afterwards ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    """One kept run, as listed by ``runs()``: its record, and its rows on demand."""

    record: dict
    store: RunStore

    @property
    def id(self) -> int:
        return self.record["id"]

    def __getitem__(self, key: str):
        return self.record[key]

    def metrics(self, as_frame: bool | None = None):
        """Metric rows (dicts; NaN/inf losses as floats), or a pandas DataFrame when pandas is
        installed (``as_frame=None``) or asked for (``as_frame=True``)."""
        rows = []
        for r in self.store.metrics(self.id):
            if r["nonfinite"]:
                r["loss"] = float(r["nonfinite"])
            extra = r.pop("extra")
            r.pop("nonfinite")
            rows.append({**r, **{k: v for k, v in extra.items() if k not in r}})
        if as_frame is False:
            return rows
        try:
            import pandas as pd
        except ImportError:
            if as_frame:
                raise UsageError("as_frame=True needs pandas: pip install pandas") from None
            return rows
        return pd.DataFrame(rows)

    def health(self) -> list[dict]:
        """Each rank's latest health."""
        return self.store.health(self.id)

    def events(self) -> list[dict]:
        """The run's events, oldest first."""
        return self.store.events(self.id)

    def loss_curve(self) -> tuple[list, list]:
        """Mean loss over ranks at each step: (steps, losses)."""
        acc: dict[int, list] = {}
        for r in self.store.metrics(self.id):
            if r["step"] is not None and r["loss"] is not None:
                a = acc.setdefault(r["step"], [0.0, 0])
                a[0] += r["loss"]
                a[1] += 1
        steps = sorted(acc)
        return steps, [acc[s][0] / acc[s][1] for s in steps]

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(repr(self))

    def __repr__(self) -> str:
        r = self.record
        loss = r["nonfinite"] or (f"{r['loss']:.4g}" if r["loss"] is not None else "-")
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["started"]))
        return (f"<Run {r['id']} {r['status']} {r['world_size']} ranks, step {r['step']}, "
                f"loss {loss}, started {started}>")


class RunList(list):
    """``runs()``'s answer: a list of Run, shown as a table."""

    def __repr__(self) -> str:
        if not self:
            return "no runs recorded yet"
        lines = [f"{'id':>4}  {'status':<11} {'ranks':>5} {'step':>7} {'loss':>10}  started"]
        for run in self:
            r = run.record
            loss = r["nonfinite"] or (f"{r['loss']:.4g}" if r["loss"] is not None else "-")
            started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["started"]))
            lines.append(f"{r['id']:>4}  {r['status']:<11} {r['world_size']:>5} "
                         f"{r['step'] if r['step'] is not None else '-':>7} {loss:>10}  {started}")
        return "\n".join(lines)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(repr(self))


def runs(limit: int = 20, store: RunStore | None = None) -> RunList:
    """The latest kept runs, newest first (each a ``Run``: ``run.metrics()``, ``run["status"]``)."""
    store = store or RunStore()
    return RunList(Run(r, store) for r in store.list_runs(limit))


def _run(ref, store: RunStore) -> Run:
    if isinstance(ref, Run):
        return ref
    if isinstance(ref, bool) or not isinstance(ref, int):
        raise UsageError(f"compare() takes runs or run ids, not {ref!r}")
    rec = store.get_run(ref)
    if rec is None:
        raise UsageError(f"there is no run {ref}: nbdist.runs() lists the kept ones")
    return Run(rec, store)


def _figure_class():
    from matplotlib.figure import Figure

    class _Figure(Figure):
        """A Figure that shows itself as PNG in a notebook, with or without pyplot."""

        def _repr_png_(self) -> bytes:
            from .dashboard import _png

            return _png(self)

    return _Figure


def compare(*run_refs, store: RunStore | None = None, per_rank: bool = False):
    """Plot the loss curves of several runs together (mean over ranks; each rank with
    ``per_rank=True``). Takes ``Run`` objects or run ids; returns the matplotlib Figure."""
    _Figure = _figure_class()
    if len(run_refs) == 1 and isinstance(run_refs[0], Sequence):
        run_refs = tuple(run_refs[0])
    if not run_refs:
        raise UsageError("compare() needs at least one run: compare(run_a, run_b) or ids")
    store = store or RunStore()
    chosen = [_run(r, store) for r in run_refs]
    fig = _Figure(figsize=(8, 4), dpi=90)
    ax = fig.add_subplot()
    for run in chosen:
        label = f"run {run.id}" + (f" {run['label'] or run['name']}" if run["label"] or run["name"]
                                   else "")
        if per_rank:
            by_rank: dict[int, tuple[list, list]] = {}
            for r in store.metrics(run.id):
                if r["step"] is not None and r["loss"] is not None and math.isfinite(r["loss"]):
                    s, v = by_rank.setdefault(r["rank"], ([], []))
                    s.append(r["step"])
                    v.append(r["loss"])
            for rank, (s, v) in sorted(by_rank.items()):
                ax.plot(s, v, lw=0.8, label=f"{label} rank {rank}")
        else:
            steps, losses = run.loss_curve()
            ax.plot(steps, losses, lw=1.5, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("loss: " + " vs ".join(f"run {r.id}" for r in chosen))
    return fig
