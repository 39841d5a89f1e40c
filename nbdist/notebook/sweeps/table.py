"""A sweep's trials as a table: what a sweep returns, and ``nbdist.trials(name)`` reads back.

Each trial is a run in the run store whose options carry the sweep's name, the trial's id and
its values (``notebook.sweep``); ``trials()`` gathers the runs of one sweep into a
``TrialTable``, one ``TrialRow`` per trial, with the latest and best loss of the trial's main
rank. ``table.best(3)`` are the three lowest best losses, for ``nbdist.compare``;
``pull_trial`` brings a name a trial's cell bound from its engine (the best trial's, after it).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any

from ...errors import UsageError
from ...telemetry.store import RunStore
from ...worker import api
from .. import session
from ..cluster import fanout
from ..cluster.transfer import unpack
from ..session import PULL_TIMEOUT

_RUNS_READ = 10_000  # the newest runs searched for a sweep's trials


@dataclass(frozen=True)
class TrialRow:
    """One trial: its values, how it ended, its latest and best loss, and its run's id."""

    trial: int
    values: dict[str, Any]
    state: str  # queued, running, done, failed, stopped
    ranks: tuple[int, ...] = ()
    step: int | None = None
    loss: float | None = None
    best: float | None = None
    samples_per_s: float | None = None
    note: str = ""
    run_id: int | None = None


class TrialTable(list):
    """A sweep's trials (``TrialRow``s), in trial order, shown as a table."""

    def __init__(self, name: str, rows: list[TrialRow]) -> None:
        super().__init__(rows)
        self.name = name

    def best(self, k: int = 1) -> list[TrialRow]:
        """The ``k`` trials with the lowest best loss (finished ones first)."""
        scored = [r for r in self if r.best is not None and math.isfinite(r.best)]
        scored.sort(key=lambda r: (r.state != "done", r.best))
        return scored[:k]

    def row(self, trial: int | str) -> TrialRow:
        """The row of trial ``trial`` (an id, or ``"best"``); one line when there is none."""
        if trial == "best":
            best = self.best(1)
            if not best:
                raise UsageError(
                    f"no trial of sweep {self.name!r} reported a loss: name a trial id"
                )
            return best[0]
        for r in self:
            if str(r.trial) == str(trial):
                return r
        raise UsageError(
            f"sweep {self.name!r} has no trial {trial!r}: use 'best' or an id from 0 to "
            f"{len(self) - 1}"
        )

    def as_frame(self) -> Any:
        """The table as a pandas DataFrame (one column per swept name)."""
        import pandas as pd

        return pd.DataFrame(
            [{"trial": r.trial, **r.values, **_figures(r)} for r in self]
        ).set_index("trial")

    def __repr__(self) -> str:
        if not self:
            return f"sweep {self.name!r}: no trials"
        names = list(self[0].values)
        head = ["trial", *names, "state", "step", "loss", "best", "samples/s", "note"]
        rows = [
            [str(r.trial), *(_text(r.values.get(n)) for n in names), r.state]
            + [_text(v) for v in _figures(r).values()][:4]
            + [r.note[:60]]
            for r in self
        ]
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
        return f"sweep {self.name!r}: {len(self)} trials\n" + "\n".join(lines)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(repr(self))


def _figures(r: TrialRow) -> dict[str, Any]:
    return {"step": r.step, "loss": r.loss, "best": r.best, "samples_per_s": r.samples_per_s}


def _text(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def trials(name: str | None = None, store: RunStore | None = None) -> TrialTable:
    """The trials of the sweep named ``name`` (``--name``), or of the latest sweep, from the run
    store: one row per trial, with its values and metrics (a trial restarted under
    ``--restarts`` shows its last attempt)."""
    if name is not None and not isinstance(name, str):
        raise UsageError(f"trials() takes a sweep's name, not {name!r}")
    store = store or RunStore()
    runs = [r for r in store.list_runs(_RUNS_READ) if "sweep" in (r.get("options") or {})]
    if not runs:
        raise UsageError("no sweep is recorded yet: run %%distributed --sweep NAME=VALUES first")
    name = runs[0]["options"]["sweep"] if name is None else name  # newest first
    mine = [r for r in runs if r["options"]["sweep"] == name]
    if not mine:
        known = sorted({r["options"]["sweep"] for r in runs})
        raise UsageError(f"no sweep named {name!r}: the recorded ones are {', '.join(known)}")
    latest: dict[int, dict] = {}
    for r in reversed(mine):  # oldest first: a later attempt of a trial replaces an earlier one
        latest[int(r["options"]["trial"])] = r
    return TrialTable(name, [_row(tid, r, store) for tid, r in sorted(latest.items())])


_STATES = {"ok": "done", "failed": "failed", "stopped": "stopped", "interrupted": "stopped"}


def _row(trial: int, run: dict, store: RunStore) -> TrialRow:
    opts = run["options"]
    main = min(opts.get("ranks") or [0])
    losses = [
        (m["step"], m["loss"])
        for m in store.metrics(run["id"])
        if m["rank"] == main and m["step"] is not None and m["loss"] is not None
    ]
    finite = [v for _, v in losses if math.isfinite(v)]
    return TrialRow(
        trial=trial,
        values=dict(opts.get("values") or {}),
        state=_STATES.get(run["status"], run["status"]),
        ranks=tuple(opts.get("ranks") or ()),
        step=losses[-1][0] if losses else run["step"],
        loss=losses[-1][1] if losses else run["loss"],
        best=min(finite) if finite else None,
        samples_per_s=run["samples_per_s"],
        run_id=run["id"],
    )


_last: tuple[weakref.ref, TrialTable] | None = None  # the latest sweep: its cluster, its table


def keep(cluster: Any, table: TrialTable) -> None:
    """Remember ``table`` as ``cluster``'s latest sweep (what ``--trial`` pulls from)."""
    global _last
    _last = (weakref.ref(cluster), table)


def pull_trial(name: str, trial: int | str = "best") -> Any:
    """``name`` as the latest sweep's ``trial`` (an id, or ``"best"``) left it on its first
    rank (``%nbdist pull NAME --trial best``)."""
    cluster = session.current()
    table = _last[1] if _last is not None and _last[0]() is cluster else None
    if table is None:
        raise UsageError("no sweep has run on this cluster: --trial pulls from a sweep's trial")
    row = table.row(trial)
    got = fanout.on_ranks(
        cluster, api.fetch_trial, row.trial, name, ranks=[row.ranks[0]], timeout=PULL_TIMEOUT
    )
    got.check(f"pull of {name!r} from trial {row.trial}", UsageError)
    packed = got.values[row.ranks[0]]
    if packed is None:
        raise UsageError(
            f"trial {row.trial} did not bind {name!r}: pull a name its cell assigned (after a "
            "sweep, only the best trial's names are kept)"
        )
    return unpack(packed)
