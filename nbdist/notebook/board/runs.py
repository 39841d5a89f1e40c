"""Every ``%%distributed`` run, kept: ``runs()`` lists them, ``compare()`` plots them together.

``runs()`` returns the latest runs (a cell that reported, checkpointed, was named or failed; the
session's other cells with ``all=True``: ``telemetry.listing``), found by ``name=`` (a part of it)
and ``status=``, sorted by ``sort=`` (any summary metric: ``"min:loss"``), and shows them as a table
that says how many there are in all. Each is a ``Run``: its record, ``run.metrics()`` as plain data
or a pandas DataFrame, every reported metric a column; ``run.health()``, ``run.events()``,
``run.curve("acc")``; ``run.to_mlflow()``, ``to_wandb()``, ``to_comet()`` send it to a tracker);
``compare(a, b, metric="acc", log=False)`` plots one metric of several runs on one matplotlib
Figure. All of it reads the run store (``telemetry.store``), folded into curves as the boards and
the sidebar fold them (``telemetry.series``); the live side, which writes it, is the run's observers
(``run.observers.store``)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import UsageError
from ...telemetry.listing import RunQuery
from ...telemetry.series import RunSeries, fold_rows
from ...telemetry.store import RunStore


@dataclass(frozen=True)
class Run:
    """One kept run, as listed by ``runs()``: its record, and its rows on demand."""

    record: dict
    store: RunStore

    @property
    def id(self) -> int:
        """The run's id in the store."""
        return self.record["id"]

    def __getitem__(self, key: str) -> Any:
        return self.record[key]

    def metrics(self, as_frame: bool | None = None) -> Any:
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

    def series(self) -> RunSeries:
        """Every metric of the run, per rank and the mean over ranks, as the boards draw them
        (at most a few thousand points each, spikes kept)."""
        series = RunSeries()
        fold_rows(series, self.store.metrics(self.id))
        series.settle(final=True)
        return series

    def curve(self, metric: str = "loss") -> tuple[list, list]:
        """The mean of ``metric`` over ranks at each step: (steps, values)."""
        series = self.series()
        _known(self, series, metric)
        mean = series.mean[metric]
        return mean.x, mean.y

    def loss_curve(self) -> tuple[list, list]:
        """Mean loss over ranks at each step: (steps, losses)."""
        return self.curve("loss")

    # -- to an experiment tracker, afterwards (see nbdist.notebook.trackers.export) ------------
    def to_mlflow(self, checkpoints: bool = False) -> str:
        """Send this finished run to MLflow (as ``MLFLOW_TRACKING_URI`` and MLflow's defaults
        say); return the MLflow run's id. ``checkpoints``: its checkpoint folder too, as
        artifacts (only when asked: checkpoints are large, and private to you)."""
        return self._send("mlflow", checkpoints)

    def to_wandb(self, checkpoints: bool = False) -> Any:
        """Send this finished run to Weights & Biases (``WANDB_PROJECT``, ``WANDB_MODE``...);
        return the W&B run. ``checkpoints``: its checkpoint folder too, as an artifact."""
        return self._send("wandb", checkpoints)

    def to_comet(self, checkpoints: bool = False) -> Any:
        """Send this finished run to Comet (its config; offline with
        ``COMET_START_ONLINE=false``); return the Comet experiment. ``checkpoints``: its
        checkpoint folder too, as assets."""
        return self._send("comet", checkpoints)

    def _send(self, tracker: str, checkpoints: bool) -> Any:
        from ..trackers import export

        record = self.store.get_run(self.id) or self.record
        return export.send(record, self.store, tracker, checkpoints=checkpoints)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(repr(self))

    def __repr__(self) -> str:
        r = self.record
        loss = r["nonfinite"] or (f"{r['loss']:.4g}" if r["loss"] is not None else "-")
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["started"]))
        return (
            f"<Run {r['id']} {r['status']} {r['world_size']} ranks, step {r['step']}, "
            f"loss {loss}, started {started}>"
        )


class RunList(list):
    """``runs()``'s answer: a list of Run, shown as a table that says how many runs ``query``
    found in all (``total``) and how to see the others."""

    def __init__(self, runs: Iterable[Run] = (), total: int | None = None, query=None):
        super().__init__(runs)
        self.total = len(self) if total is None else total
        self.query = query or RunQuery()

    def __repr__(self) -> str:
        q = self.query
        if not self and self.total:
            return self._more()
        if not self and (q.name or q.status):
            asked = [f"name {q.name!r}"] if q.name else []
            asked += [f"status {' or '.join(q.status)}"] if q.status else []
            return f"no runs with {' and '.join(asked)}; runs() lists the latest of every name"
        if not self:
            return "no runs recorded yet"
        width = min(_NAME_WIDTH, max(4, *(len(r["name"] or r["label"]) for r in self)))
        lines = [
            f"{'id':>4}  {'name':<{width}}  {'status':<11} {'ranks':>5} {'step':>7} "
            f"{'loss':>10}  started"
        ]
        for run in self:
            r = run.record
            name = r["name"] or r["label"]
            name = name if len(name) <= width else name[: width - 1] + "…"
            loss = r["nonfinite"] or (f"{r['loss']:.4g}" if r["loss"] is not None else "-")
            started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["started"]))
            lines.append(
                f"{r['id']:>4}  {name:<{width}}  {r['status']:<11} {r['world_size']:>5} "
                f"{r['step'] if r['step'] is not None else '-':>7} {loss:>10}  {started}"
            )
        if self.total > len(self):
            lines.insert(0, self._more())
        return "\n".join(lines)

    def _more(self) -> str:
        """ "showing 20 of 134 runs; runs(limit=...) or runs(name=...) for others"."""
        q = self.query
        first = f"{q.offset + 1}-{q.offset + len(self)}" if q.offset and self else len(self)
        return (
            f"showing {first} of {self.total} runs; runs(limit=...), runs(name=...) or "
            "runs(status=...) for others"
        )

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(repr(self))


_NAME_WIDTH = 24


def runs(
    limit: int = 20,
    *,
    name: str = "",
    status: str | Sequence[str] = (),
    sort: str = "time",
    order: str = "",
    all: bool = False,
    store: RunStore | None = None,
) -> RunList:
    """The latest runs, newest first, each a ``Run`` (``run.metrics()``, ``run["status"]``).

    A run is a cell that reported a metric, wrote a checkpoint, was named (``--name``) or
    failed; ``all=True`` lists the session's other cells too. ``name``: a part of the name, in
    any case (``runs(name="cnn")``); ``status``: one or more of running, ok, failed,
    interrupted, stopped, lost; ``sort``: time, duration, name, status, step or a metric of the
    runs' summaries (``"loss"``: its last mean; ``"min:loss"``, ``"max:acc"``), ``order``
    asc or desc. The table it shows says how many runs there are in all."""
    query = RunQuery(limit=limit, name=name, status=status, sort=sort, order=order, all=bool(all))
    store = store or RunStore()
    found, total = store.find_runs(query)
    return RunList((Run(r, store) for r in found), total, query)


def _run(ref: Any, store: RunStore) -> Run:
    if isinstance(ref, Run):
        return ref
    if getattr(ref, "run_id", None) is not None:  # a sweep's trial (sweeps.table.TrialRow)
        ref = ref.run_id
    if isinstance(ref, bool) or not isinstance(ref, int):
        raise UsageError(f"compare() takes runs or run ids, not {ref!r}")
    rec = store.get_run(ref)
    if rec is None:
        raise UsageError(f"there is no run {ref}: nbdist.runs() lists the kept ones")
    return Run(rec, store)


def _figure_class() -> type:
    from matplotlib.figure import Figure

    from .charts import figure_png

    class _Figure(Figure):
        """A Figure that shows itself as PNG in a notebook, with or without pyplot."""

        def _repr_png_(self) -> bytes:
            return figure_png(self)

    return _Figure


def compare(
    *run_refs: Any,
    metric: str = "loss",
    log: bool = False,
    per_rank: bool = False,
    store: RunStore | None = None,
) -> Any:
    """Plot one metric of several runs together: the mean over ranks (each rank with
    ``per_rank=True``), on a log axis with ``log=True``. Takes ``Run`` objects, run ids or a
    sweep's trials (``nbdist.trials().best(3)``); returns the matplotlib Figure."""
    _Figure = _figure_class()
    if len(run_refs) == 1 and isinstance(run_refs[0], Sequence):
        run_refs = tuple(run_refs[0])
    if not run_refs:
        raise UsageError("compare() needs at least one run: compare(run_a, run_b) or ids")
    if not isinstance(metric, str) or not metric:
        raise UsageError(f"compare(metric=...) takes a metric's name, like 'acc', not {metric!r}")
    store = store or RunStore()
    chosen = [_run(r, store) for r in run_refs]
    folded = [(run, run.series()) for run in chosen]
    for run, series in folded:
        _known(run, series, metric)
    fig = _Figure(figsize=(8, 4), dpi=90)
    ax = fig.add_subplot()
    lows = []
    for run, series in folded:
        label = f"run {run.id}" + (
            f" {run['label'] or run['name']}" if run["label"] or run["name"] else ""
        )
        curves = (
            [(f"{label} rank {r}", c) for r, c in sorted(series.ranks[metric].items())]
            if per_rank
            else [(label, series.mean[metric])]
        )
        for name, c in curves:
            ax.plot(c.x, c.y, lw=0.8 if per_rank else 1.5, label=name)
            lows.extend(c.y)
    if log:
        ax.set_yscale("log" if lows and min(lows) > 0 else "symlog")
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    legend = ax.legend(fontsize=8)
    for text in legend.get_texts():
        text.set_parse_math(False)
    ax.set_title(f"{metric}: " + " vs ".join(f"run {r.id}" for r in chosen), parse_math=False)
    return fig


def _known(run: Run, series: RunSeries, metric: str) -> None:
    if metric not in series.mean:
        reported = ", ".join(series.names) or "nothing"
        raise UsageError(f"run {run.id} has no metric {metric!r}: it reported {reported}")
