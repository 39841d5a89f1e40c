"""Each rank's part of a running cell, and how the cell ended, told from their outcomes.

``RankRun`` is what the supervisor keeps per rank while the cell runs (its reply, what it sent);
``summarise`` turns their outcomes into the ``CellReport`` the run's controller decides on: rank
0's value, the failures (the cell's own deadline said as such, a lost rank the cell outlived
left out), the ranks lost, whether the group broke.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from ipyparallel.error import RemoteError

from ...errors import RankFailure
from ...protocol import CellOutcome
from ..cluster.transfer import unpack
from .observers.base import Stop
from .output import RankStreams


def lost(kind: str, summary: str) -> CellOutcome:
    """The outcome of a rank whose engine died, hung or had to be killed (no reply from it)."""
    return CellOutcome(kind=kind, at=time.time(), summary=summary)


def late_interrupt(exc: Exception) -> bool:
    """Did the rank's call raise an interrupt outside the cell's own handling (a peer's stop
    reached it first and its own SIGINT came as it left the cell)? Its engine answered, so it
    lives on: counted lost, such ranks were killed and given fresh engines after a --timeout
    stop (ranks 2-15 of 16, under load). An engine that died answers ``EngineError``."""
    return isinstance(exc, RemoteError) and exc.ename == "KeyboardInterrupt"


@dataclass
class RankRun:
    """One rank's part of a running cell, as observers see it at each poll (a
    ``board.collector.RankFeed``): ``metadata`` holds what the engine has sent so far (output,
    telemetry); ``outcome`` is set once known; ``seen``: its streams as last read."""

    rank: int
    engine_id: int
    pid: int
    ar: object  # fanout.Reply (fanout.Unsent: never sent, its engine gone)
    outcome: CellOutcome | None = None
    metadata: dict = field(default_factory=dict)  # ar.metadata, filled in as it comes
    streams: RankStreams | None = None  # its output as read so far (and shown, if it is)


@dataclass
class CellReport:
    """How a cell ended: rank 0's value, failures, and the ranks that must be replaced."""

    value: object = None
    failures: list[RankFailure] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)  # ranks whose engine died or had to be killed
    interrupted: bool = False
    stopped: Stop | None = None  # an observer stopped it (--stop-on-nan): the failure, why
    group_broken: bool = False
    seconds: float = 0.0
    went_on: dict[int, str] = field(default_factory=dict)  # lost ranks the cell outlived: why


def summarise(
    report: CellReport,
    ranks: dict[int, RankRun],
    main_rank: int,
    whole: bool,
    deadline: float | None,
    mismatch: RankFailure | None,
) -> dict[int, tuple[RankFailure, int]]:
    """Fill ``report`` from the ranks' outcomes; each failed rank's failure and pid.
    ``whole``: the cell ran on every rank of the cluster (a rank that formed no group breaks
    it); ``deadline``: the cell ran past ``--timeout`` (its stopped ranks failed by it);
    ``mismatch``: ranks ran different collectives, the cause put first."""
    failed: dict[int, tuple[RankFailure, int]] = {}
    for rk in ranks.values():
        out = rk.outcome
        if not out.group_formed and whole:
            report.group_broken = True
        if out.ok:
            if rk.rank == main_rank:
                report.value = unpack(out.value)
            continue
        if deadline is not None and out.kind in ("interrupted", "hung"):
            # the cell's own deadline, not a lost worker: --restarts does not retry it (an
            # engine that would not stop was killed all the same, and is replaced after)
            if out.kind == "hung":
                report.lost.append(rk.rank)
            out = dataclasses.replace(
                out, kind="timeout", summary=f"stopped: the cell ran past --timeout {deadline:g} s"
            )
        if out.kind in ("died", "hung"):
            report.lost.append(rk.rank)
            if rk.rank in report.went_on:  # told when it happened; not the cell's failure
                continue
        failure = RankFailure(rk.rank, out.summary, out.traceback, out.at, out.kind)
        report.failures.append(failure)
        failed[rk.rank] = (failure, rk.pid)
    if mismatch is not None:  # the cause, before what it made the waiting ranks raise
        report.failures.insert(0, mismatch)
        failed[mismatch.rank] = (mismatch, ranks[mismatch.rank].pid)
    if report.failures:
        report.group_broken = True
    return failed
