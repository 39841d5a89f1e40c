"""Where a sweep's trials run: the cluster tiled into blocks of ``trial_size`` ranks.

``Blocks`` is the pool: blocks free to take, and the ranks lost during the sweep (a block with
a lost rank is retired for the rest of it; its engines are replaced after the sweep). ``Block``
is one trial's ``run.formation.Formation``: it takes a free block and makes the trial's group
there, on a store of the block's own (``Ranks.group_of``), afresh at each attempt, so
``nbdist.rank()``, ``world_size()`` and the torchrun variables describe the trial. When a rank
of its block is lost, the block is retired and the trial waits for another (``mend``); when the
trial ends, its block goes back to the pool.
"""

from __future__ import annotations

from collections import deque

from ...errors import NbdistError
from ...protocol import Program, RankInfo, TrialInfo
from ..cluster import fanout
from ..cluster.ranks import Ranks
from ..run.outcomes import CellReport
from ..run.recovery import Decision


class Blocks:
    """The sweep's blocks: free ones, in order, and the ranks lost so far."""

    def __init__(self, cluster: Ranks, size: int):
        self.cluster = cluster
        n = len(cluster.slots)
        self.free: deque[tuple[int, ...]] = deque(
            tuple(range(b * size, (b + 1) * size)) for b in range(n // size)
        )
        self.lost: set[int] = set()
        self.held = 0  # blocks taken by trials now

    def exhausted(self) -> bool:
        """No block is free and none will be: every block lost a rank."""
        return not self.free and not self.held

    def take(self) -> tuple[tuple[int, ...], dict[int, RankInfo]] | None:
        """A free block and a new group on it; None when none is free now. A block whose
        engine died while idle is retired and the next tried; another failure to make the
        group is an NbdistError."""
        while self.free:
            block = self.free.popleft()
            try:
                groups = self.cluster.group_of(block)
            except Exception as exc:  # e.g. the block's first engine died while idle
                if self._lost_in(block):
                    continue
                self.free.appendleft(block)
                raise NbdistError(f"not started: {fanout.one_line(exc)}") from None
            self.held += 1
            return block, groups
        return None

    def give_back(self, block: tuple[int, ...], lost: list[int]) -> None:
        """A trial is done with ``block``: free again, or retired when it lost ``lost``."""
        self.held -= 1
        if lost:
            self.lost.update(lost)
        else:
            self.free.append(block)

    def _lost_in(self, block: tuple[int, ...]) -> bool:
        """Note the ranks of ``block`` whose engine is gone; whether there were any."""
        cl = self.cluster
        exited, alive = cl.drain_exits(), set(cl.client.ids)
        gone = [r for r in block if cl.slots[r].pid in exited or cl.slots[r].engine_id not in alive]
        self.lost.update(gone)
        return bool(gone)


class Block:
    """One trial's formation: its block of ranks, and its own group there (see the module)."""

    whole = False  # a trial's group is not the world's: the notebook's objects stay as they are

    def __init__(self, blocks: Blocks, trial: TrialInfo):
        self.blocks = blocks
        self.trial = trial
        self.block: tuple[int, ...] = ()
        self._groups: dict[int, RankInfo] = {}

    def place(self) -> bool:
        """Take a free block (and make the trial's group there); False while none is free."""
        got = self.blocks.take()
        if got is None:
            return False
        self.block, self._groups = got
        return True

    def ranks(self) -> tuple[int, ...]:
        return self.block

    def groups(self) -> dict[int, RankInfo]:
        return self._groups

    def mend(self, decision: Decision, lost: list[int]) -> bool:
        if self.block:
            self.blocks.give_back(self.block, lost)
            self.block = ()
        if self.place():
            return True
        if self.blocks.exhausted():
            raise NbdistError("no whole block of ranks was left")
        return False  # the trial waits for a block to free up

    def settle(self, program: Program, report: CellReport, clean: bool, run_key: str) -> str:
        if self.block:
            self.blocks.give_back(self.block, sorted(set(report.lost)))
        return ""
