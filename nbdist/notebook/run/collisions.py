"""Ranks that ran different numbers of collectives: one ended its cell, another waits in a
collective the first will never join.

The supervisor looks at the ranks still running a while after one ended its cell well
(``supervisor.CellRun``); each rank says, with its stacks and with its latest health sample, how
many collectives it entered in the cell and which one it is in
(``worker.collectives.counting``). ``waiting`` picks the ranks in a collective; ``failure`` is
the one line that ends the cell: the waiting rank, its collective and its count, the ranks that
ended and theirs, and what to do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ...errors import RankFailure
from ...protocol import CellOutcome, RankStacks
from ...telemetry.events import HealthSample

#: Function names that mark a collective on a stack read from outside the process (``py-spy``).
_COLLECTIVE_FRAMES = ("all_reduce", "allreduce", "broadcast", "barrier", "all_gather", "_wait")


def waiting(
    stacks: Mapping[int, RankStacks | str], health: Mapping[int, HealthSample | None]
) -> dict[int, RankStacks]:
    """The ranks whose stacks say they are in a collective now, with their count (from their
    latest health sample where the stacks were read from outside the process, ``py-spy``)."""
    out = {}
    for rank, got in stacks.items():
        if isinstance(got, str):
            continue
        sample = health.get(rank)
        if got.collectives < 0 and sample is not None and sample.in_collective:
            got = dataclasses.replace(
                got, collectives=sample.collectives, in_collective=sample.in_collective
            )
        seen = _collective_on_stack(got) if got.how == "py-spy" else ""
        if got.in_collective or seen:
            out[rank] = got if got.in_collective else dataclasses.replace(got, in_collective=seen)
    return out


def _collective_on_stack(got: RankStacks) -> str:
    """The collective the main thread's stack is in (its outermost frame that is one), or ""."""
    main = [t for t in got.threads if t.main] or list(got.threads[:1])
    found = [f.function for t in main for f in t.frames if f.function in _COLLECTIVE_FRAMES]
    named = [f for f in found if f != "_wait"]  # a wait in shared memory: the collective's own
    if not found:
        return ""
    return (named[0] if named else "a collective").replace("allreduce", "all_reduce")


def failure(waiting: Mapping[int, RankStacks], ended: Mapping[int, CellOutcome]) -> RankFailure:
    """The one line that ends a cell whose ranks ran different collectives (as the first
    waiting rank's failure: the cause)."""
    rank = min(waiting)
    got = waiting[rank]
    name = got.in_collective or "a collective"
    count = f", its collective #{got.collectives} of this cell" if got.collectives > 0 else ""
    done = ", ".join(
        f"rank {r} after {out.collectives}" if out.collectives else f"rank {r}"
        for r, out in sorted(ended.items())
    )
    line = (
        f"rank {rank} waits in {name}{count}, for ranks that ended the cell ({done} "
        "collectives): the ranks ran different numbers of collectives (a loop that stops on "
        "the clock, or uneven data). Make them agree on when to stop (rank 0 decides and "
        "broadcasts it, or all-reduce a stop flag), give every rank the same number of batches "
        "(nbdist.loader does), or use torch's Join"
    )
    return RankFailure(rank, line, kind="error")
