"""Cells that outlive a lost rank: ``sync="async"`` training goes on when an engine dies.

Every other cell ends within seconds of one rank's failure (``supervisor``). A rank trained with
``sync="async"`` says when it prepares, and at each cell's start, that it needs no other rank
(it publishes ``GOES_ON_KEY``). When a rank is lost (its engine died, or was killed past the
progress deadline) and every other rank still running, or done, has said so, the loss is told
in one line and as a ``failure`` event, and the cell runs on to its end on the others;
afterwards the lost rank is replaced like any other (``cluster.ranks.Ranks.repair``), without
the names of earlier cells. An exception on a rank is no loss: it stops the cell as always.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...telemetry.events import GOES_ON_KEY

_LOST = ("died", "hung")


def goes_on(rank: int, ranks: Mapping[int, Any]) -> bool:
    """Whether the cell runs on without ``rank`` (a ``RankRun`` whose outcome is known): it was
    lost, and every other rank still running, or done, trains on without it."""
    out = ranks[rank].outcome
    if out is None or out.kind not in _LOST:
        return False
    alive = [rk for r, rk in ranks.items() if r != rank and (rk.outcome is None or rk.outcome.ok)]
    return bool(alive) and all(rk.metadata.get("data", {}).get(GOES_ON_KEY) for rk in alive)


def tell(lost: Any, prefix: str, watch: Any) -> str:
    """Say once that the cell goes on without ``lost`` (a ``RankRun``), under the cell and to
    the run's watch (``observers.watch.Watch``, or None); the line said."""
    rank, summary = lost.rank, lost.outcome.summary
    line = f"{prefix}nbdist: rank {rank} lost: {summary}; sync='async' trains on without it"
    print(line, flush=True)
    if watch is not None:
        watch.on_event("failure", rank, summary, {"cause": "lost", "goes_on": True})
    return line
