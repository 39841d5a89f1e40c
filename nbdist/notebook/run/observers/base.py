"""What a run's observers are told, and the records they are told with.

A run (one ``%%distributed`` cell, script or sweep trial, through its restarts) is watched by a
``watch.Watch``: the supervisor hands it the ranks at every look, the controller its phases and
recovery's events. The watch folds what arrived (``board.collector.Collector``) and tells each
``Observer``, in this order and from the kernel's main thread:

- ``on_records``: a rank's metric records, as they arrive;
- ``on_mean``: a newly settled point of a metric's mean over ranks;
- ``on_event``: an event (the engines', a NaN loss, a change of a rank's state, recovery's);
- ``on_tick``: at the board's pace (the cell's ``--refresh``), at once when a rank dies
  and at each change of phase: the live state as it stands (``Tick``);
- ``on_end``: once, how the run ended (``RunEnd``).

Every observer learns who the run is (``RunInfo``) when it is made. An observer is one output
with one job; it never calls another. One that wants the run stopped says so through ``Stop``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ....config import CellOptions
from ....errors import Cause, RankFailure, cause
from ....protocol import TrialInfo
from ....telemetry.events import MetricRecord, RunEvent
from ....telemetry.format import fmt_duration

if TYPE_CHECKING:
    from ...board.collector import Collector
    from ...debug.profile import Profile


class Phase(enum.Enum):
    """Where a run is. ``controller.TRANSITIONS`` says which change may follow which."""

    STARTING = "starting"
    RUNNING = "running"
    RECOVERING = "recovering"
    FINISHED = "finished"
    FAILED = "failed"
    INTERRUPTED = "interrupted"

    @property
    def terminal(self) -> bool:
        return self in (Phase.FINISHED, Phase.FAILED, Phase.INTERRUPTED)


@dataclass(frozen=True)
class RunInfo:
    """Who a run is: what every observer is made with."""

    run_id: int | None  # its id in the run store; None when the store cannot be written
    source: str  # the cell's (or script's) text
    options: CellOptions
    ranks: tuple[int, ...]  # the cluster's ranks it runs on
    started: float  # time.time(): one start, so its length reads the same everywhere
    cluster_id: str = ""
    trial: TrialInfo | None = None  # a sweep's trial: its sweep, id and values
    label: str = ""  # a trial's, as listed: "trial 3: lr=0.1"

    @property
    def name(self) -> str:
        return self.options.name

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def stored_options(self) -> dict[str, Any]:
        """The options as the run store and the trackers keep them: every cell option, and a
        trial's sweep, id and values."""
        out: dict[str, Any] = dict(vars(self.options))
        if self.trial is not None:
            out |= {"sweep": self.trial.sweep, "trial": self.trial.trial}
            out["values"] = dict(self.trial.values)
        return out


@dataclass(frozen=True)
class Tick:
    """The live run as it stands, at the board's pace: ``live`` is the collector's fold (read
    it, never change it); ``urgent`` when a rank just died (what the sidebar shows is written
    now, not at the next pace)."""

    live: Collector
    status: str  # running | recovering
    now: float  # time.time()
    urgent: bool = False


@dataclass(frozen=True)
class RunEnd:
    """How a run ended, told once: ``status`` is ok, failed, stopped (by ``--stop-on-nan`` or
    a sweep's rule), or interrupted; ``ended`` its end, taken once for every output."""

    status: str
    ended: float
    live: Collector
    failures: tuple[RankFailure, ...] = ()
    profile: Profile | None = None  # the ranks' profiles read together (--profile)
    recorded: bool = True  # False: the run never reached the engines (its record is dropped)

    @property
    def cause(self) -> Cause | None:
        """The failure that explains the run's end, by ``errors.cause``'s rule, or None."""
        return cause(self.failures)

    def message(self) -> str:
        """The end as one line: ``failed after 3.1 s: ranks 0-3: KeyError: 'b'``."""
        line = f"{self.status} after {fmt_duration(self.ended - self.live.started)}"
        found = self.cause
        return line + (f": {found.line()}" if found else "")


@dataclass
class Stop:
    """A request to stop the run on every rank, with the failure that explains it: an observer
    makes it (``--stop-on-nan``), the supervisor carries it out at its next look."""

    reason: RankFailure | None = None
    note: str = ""  # what the run's end says of it

    def request(self, reason: RankFailure, note: str) -> None:
        if self.reason is None:
            self.reason, self.note = reason, note


class Observer:
    """One output of a run: override what it acts on (see the module's text). Every method runs
    on the kernel's main thread, inside the supervisor's loop: it must be quick."""

    def on_records(self, rank: int, records: list[MetricRecord]) -> None:
        """``rank``'s metric records, in the order it reported them."""

    def on_mean(self, name: str, step: float, value: float) -> None:
        """A settled point of ``name``'s mean over the ranks still going."""

    def on_event(self, event: RunEvent) -> None:
        """Something happened: the engines', a NaN, a rank's change of state, recovery's."""

    def on_tick(self, tick: Tick) -> None:
        """The live run, at the board's pace."""

    def on_end(self, end: RunEnd) -> None:
        """The run ended; free what the observer holds."""
