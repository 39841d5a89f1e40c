"""What a board shows of a run's ranks and events, as plain data (the live board and the final
picture share it): a rank's row of the workers table, an event as the browser keeps it, which
events are in view, and a metric's curves as a history sends them (past a few ranks, the band
about the mean and the outliers' curves alone: ``spread``).

A rank is one row through the run's attempts: after a recovery its fresh engine's row is the
same, running again, with the pid it runs on now and those of the engines it lost
(``replaced``), its steps and curves kept. The events that tell a failure and a recovery
(``RECOVERY_KINDS``) stay in view, never pushed out by the latest ordinary ones (``in_view``).
"""

from __future__ import annotations

import math
from typing import Any

from ...telemetry.curves import decimated
from ...telemetry.events import MESH_DIMENSIONS, RECOVERY_KINDS, RunEvent
from ...telemetry.series import RunSeries
from ...telemetry.spread import Spread
from .health import RankState

# points of a metric in a history (its mean's, and shared among its ranks' curves): the loss
# chart is the large one; the others are small multiples (and the browser keeps adding points)
_HISTORY_POINTS = 2000
_HISTORY_POINTS_OTHER = 500
_RECOVERY_EVENTS = 24  # events of the run's failures and recoveries kept in view, the latest


def number(x: Any) -> float | int | None:
    """A number JSON can carry: finite, or None."""
    if x is None or isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def rank_row(st: RankState, now: float, zero_based: bool) -> dict:
    """One worker-table row, as plain data (the browser and the final picture share it).
    ``steps``: the steps this rank has done, counted as the run's progress is."""
    h = st.health  # a HealthSample, or None before the first
    loss: Any = st.nonfinite if st.nonfinite is not None else number(st.loss)
    return {
        "rank": st.rank,
        "host": st.host or "",
        "pid": st.pid,
        "replaced": list(st.replaced),  # the pids of its engines lost before this one
        "state": st.state,
        "error": st.error,
        "steps": None if st.step is None else st.step + (1 if zero_based else 0),
        "loss": loss,  # its latest, reported at step loss_step
        "loss_step": st.step if st.loss is not None else None,
        "step_ms": number(st.step_time and st.step_time * 1000),
        "cpu": number(h and h.cpu),
        "rss_mb": number(h and h.rss and h.rss / 2**20),
        "gpu_util": number(h and h.gpu_util),
        "gpu_mb": number(h and h.gpu_mem and h.gpu_mem / 2**20),
        "comm": number(h and h.comm_share is not None and h.comm_share * 100),
        "data": number(h and h.data_share is not None and h.data_share * 100),  # waiting for it
        # its coordinates in its nbdist.mesh, a column per dimension: "0/2" (None without)
        **{dim: h.mesh.of(dim) if h and h.mesh else None for dim in MESH_DIMENSIONS},
        "stage": str(h.pipeline) if h and h.pipeline else None,  # a pipeline's: "0/2", "1/2 r1"
        "idle": number(h and h.idle_share is not None and h.idle_share * 100),
        # whole seconds: a row is sent again when something a person would notice changed;
        # an ended rank is not quiet, it is done
        "quiet": None
        if st.last_seen is None or st.outcome is not None
        else round(max(0.0, now - st.last_seen)),
    }


def event_dict(e: RunEvent) -> dict:
    """An event as the browser keeps it; ``kept``: it tells a failure or a recovery."""
    kind = str(e.kind)
    return {
        "time": e.time,
        "kind": kind,
        "rank": e.rank,
        "message": said(e),
        "kept": kind in RECOVERY_KINDS,
    }


def said(e: RunEvent) -> str:
    """An event's message as a board shows it after its kind: without the kind again when the
    message begins with it (the run's end, ``failed`` "failed after 1.1 s: ...", reads
    ``failed after 1.1 s: ...``, not ``failed failed after``)."""
    kind, message = str(e.kind), str(e.message or "")
    return message[len(kind) :].lstrip() if message.startswith(kind + " ") else message


def in_view(events: list[RunEvent], latest: int, kept: int = _RECOVERY_EVENTS) -> list[RunEvent]:
    """The events a board shows, in order: the ``latest`` ordinary ones, and beside them the
    (``kept`` latest) that tell the run's failures and recoveries (``RECOVERY_KINDS``), however
    many ordinary ones came after. The browser's ``inView`` is the same rule."""
    left = {False: latest, True: kept}
    out = []
    for e in reversed(events):
        pinned = e.kind in RECOVERY_KINDS
        if left[pinned] > 0:
            left[pinned] -= 1
            out.append(e)
        if not any(left.values()):
            break
    return out[::-1]


def curves_of(
    series: RunSeries, name: str, spread: Spread | None = None, outliers: list[int] | None = None
) -> dict:
    """One metric's curves as a history sends them: decimated to a few thousand points; with
    ``spread`` (many ranks), the band about the mean and the ``outliers``' curves alone."""
    points = _HISTORY_POINTS if name == "loss" else _HISTORY_POINTS_OTHER
    ranks = series.ranks[name]
    if spread is not None:
        shown = set(outliers or ())
        band = {
            side: decimated(curves[name], points)
            for side, curves in (("lo", spread.lo), ("hi", spread.hi))
            if name in curves
        }
        return {
            "ranks": {str(r): decimated(c, points) for r, c in sorted(ranks.items()) if r in shown},
            "mean": decimated(series.mean[name], points),
            "outliers": sorted(shown, key=(outliers or []).index),
            **band,
        }
    # each of a few ranks at the mean's resolution, or nearly: a decimated rank reads its own
    # stored points (the readout names their steps), but the fewer steps it lacks the better
    per_rank = max(50, points // 2, points // max(1, len(ranks)))
    return {
        "ranks": {str(r): decimated(c, per_rank) for r, c in sorted(ranks.items())},
        "mean": decimated(series.mean[name], points),
    }
