"""Where a run's cell runs, and what recovery does on the cluster: a ``Formation``.

The run's controller (``controller``) is one for a plain cell and for a sweep's trial: the same
phases, the same supervisor, the same pure policy (``recovery``). What differs is where the
cell runs and how the cluster is mended, and that is the run's formation:

- ``World``: a plain cell (or script), on the cluster's ranks (every rank, or ``--ranks``), on
  the world's group, which the cell re-forms as it starts when it does not stand. A lost rank
  gets a fresh engine (or the survivors go on, fewer), and the journal of earlier cells is
  replayed there; at the end the cluster is repaired and a cell that succeeded is journaled.
- a sweep's block (``sweeps.trials``): a trial's ranks, on a group of their own, formed afresh
  at each attempt. A lost rank retires its block; the trial waits for another.

Groups are made in one place, ``cluster.ranks.Ranks.group_of``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ...config import CellOptions
from ...protocol import Program, RankInfo, TrialInfo
from ..cluster.ranks import Ranks
from .outcomes import CellReport
from .recovery import Decision
from .replay import give_back, replay


class Formation(Protocol):
    """Where a run's attempts run, and how its lost ranks are mended."""

    trial: TrialInfo | None  # a sweep's trial (its attempt set by the controller), or None
    whole: bool  # it runs on every rank of the world: objects of earlier cells are bound to it

    def ranks(self) -> tuple[int, ...]:
        """The cluster's ranks the next attempt runs on, its main rank first."""

    def groups(self) -> dict[int, RankInfo]:
        """The group the next attempt forms as it starts (``{}``: the one standing)."""

    def mend(self, decision: Decision, lost: list[int]) -> bool:
        """Carry out ``decision`` (RESTART or SHRINK) for the ranks ``lost`` (none: a retry on
        the same engines); False while it must wait (for a block to free up); an
        ``NbdistError`` when it cannot be done."""

    def settle(self, program: Program, report: CellReport, clean: bool, run_key: str) -> str:
        """The run ended (``clean``: without failure): leave the cluster whole; the line to
        show ("" for none)."""


class World:
    """A plain cell's formation: the cluster's ranks and the world's group."""

    trial = None

    def __init__(
        self,
        cluster: Ranks,
        opts: CellOptions,
        restore: Callable[..., str] = give_back,
    ):
        self.cluster = cluster
        self.opts = opts
        self.restore = restore  # fresh engines given their lost ones' state (tests script it)
        n = len(cluster.slots)
        self.full = opts.ranks is None or sorted(set(opts.ranks)) == list(range(n))
        self.whole = self.full

    def ranks(self) -> tuple[int, ...]:
        if self.opts.ranks is not None:
            return tuple(self.opts.ranks)
        return tuple(s.rank for s in self.cluster.slots)

    def groups(self) -> dict[int, RankInfo]:
        return self.cluster.group_of() if self.full and not self.cluster.group_ready else {}

    def mend(self, decision: Decision, lost: list[int]) -> bool:
        if not lost:  # every engine lives (a full disk, say): the same ranks go again, on a
            self.cluster.note_group(False)  # fresh group, with all their names still there
            return True
        if decision is Decision.SHRINK:  # renumbered: earlier cells run again, as the world is
            self.cluster.shrink(lost)
            replay(self.cluster)
            return True
        self.cluster.replace(lost)  # the cell runs again: every rank from its last good cell
        note = self.restore(self.cluster, lost, again=True)
        if note:
            print(note, flush=True)
        return True

    def settle(self, program: Program, report: CellReport, clean: bool, run_key: str) -> str:
        note = self.cluster.repair(report.lost, report.group_broken, self.full)
        if report.lost:  # the fresh engines take over their lost engines' state
            note = "\n".join(
                filter(None, [note, self.restore(self.cluster, sorted(set(report.lost)))])
            )
        if clean:
            if self.full:  # the cell may have destroyed the group
                self.cluster.note_group(not report.group_broken)
            self.cluster.journal.add_cell(program, self.opts.ranks, run_key)
        return note
