"""Every ``%%distributed`` run, kept: ``runs()`` lists them, ``compare()`` plots them together.

``runs()`` returns the kept runs (each a ``Run``: its record, ``run.metrics()`` as plain data or a
pandas DataFrame, ``run.health()``, ``run.events()``, ``run.loss_curve()``); ``compare(a, b, ...)``
plots their loss curves on one matplotlib Figure. All of it reads the run store
(``telemetry.store``); the live side, which writes it, is ``run.monitor.RunMonitor``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import UsageError
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
        return (
            f"<Run {r['id']} {r['status']} {r['world_size']} ranks, step {r['step']}, "
            f"loss {loss}, started {started}>"
        )


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
            lines.append(
                f"{r['id']:>4}  {r['status']:<11} {r['world_size']:>5} "
                f"{r['step'] if r['step'] is not None else '-':>7} {loss:>10}  {started}"
            )
        return "\n".join(lines)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(repr(self))


_MAX_LIMIT = 100_000


def runs(limit: int = 20, store: RunStore | None = None) -> RunList:
    """The latest kept runs, newest first (each a ``Run``: ``run.metrics()``, ``run["status"]``)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= _MAX_LIMIT:
        raise UsageError(
            f"runs(limit) takes a whole number of runs from 1 to {_MAX_LIMIT}, not {limit!r:.40}"
        )
    store = store or RunStore()
    return RunList(Run(r, store) for r in store.list_runs(limit))


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


def compare(*run_refs: Any, store: RunStore | None = None, per_rank: bool = False) -> Any:
    """Plot the loss curves of several runs together (mean over ranks; each rank with
    ``per_rank=True``). Takes ``Run`` objects, run ids or a sweep's trials
    (``nbdist.trials().best(3)``); returns the matplotlib Figure."""
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
        label = f"run {run.id}" + (
            f" {run['label'] or run['name']}" if run["label"] or run["name"] else ""
        )
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
