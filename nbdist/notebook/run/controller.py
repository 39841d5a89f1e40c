"""A ``%%distributed`` run from start to end: run the cell, and when a worker is lost, recover.

The run is a small state machine. Its phases (``observers.Phase``) change only along
``TRANSITIONS``, in one place (``_enter``), and every change is told to the run's observers
(the dashboard and the run store, through ``monitor.RunMonitor``)::

    STARTING ──> RUNNING ──> FINISHED
                  │  ^  └──> FAILED | INTERRUPTED
                  v  │
               RECOVERING ──> FAILED   (no engine to replace a lost one, or replay failed)

``step()`` does one thing for the current phase and moves to the next: RUNNING sends the cell to
every rank and waits for it (``supervisor.attempt``), then asks the pure policy
(``recovery.decide``) what a failure means; RECOVERING carries out the decision on the cluster's
ranks (``cluster.ranks.Ranks``): fresh engines for the lost ranks (or fewer ranks), the journal
of earlier cells replayed (``replay``), the group re-formed. The controller decides nothing
itself; it carries out the policy's decisions. ``run`` checks a cell's options against the
cluster and carries the cell to its end.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from ...config import CellOptions
from ...errors import CellInterrupted, DistributedCellError, NbdistError, UsageError
from ...protocol import Program
from ..cluster.ranks import Ranks
from . import recovery, supervisor
from .observers import Phase, RunObserver
from .replay import replay
from .supervisor import CellReport

#: The phases that may follow each phase; ``tests/unit/test_recovery_policy.py`` checks them.
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.STARTING: frozenset({Phase.RUNNING, Phase.FAILED}),
    Phase.RUNNING: frozenset({Phase.FINISHED, Phase.FAILED, Phase.INTERRUPTED, Phase.RECOVERING}),
    Phase.RECOVERING: frozenset({Phase.RUNNING, Phase.FAILED}),
    Phase.FINISHED: frozenset(),
    Phase.FAILED: frozenset(),
    Phase.INTERRUPTED: frozenset(),
}


def run(
    cluster: Ranks,
    program: Program,
    opts: CellOptions,
    observers: list[RunObserver] | None = None,
) -> Any:
    """Run ``program`` on ``cluster``'s ranks (``opts.ranks``, or every rank) to its end,
    recovering as ``opts`` allows: rank 0's value, or the one error the person sees."""
    n = len(cluster.slots)
    if opts.ranks is not None:
        bad = [r for r in opts.ranks if not 0 <= r < n]
        if bad or not opts.ranks:
            raise UsageError(
                f"--ranks must name ranks between 0 and {n - 1}, not {list(opts.ranks)}"
            )
    full = opts.ranks is None or sorted(set(opts.ranks)) == list(range(n))
    if opts.restarts and not full:
        raise UsageError("--restarts needs every rank: drop --ranks")
    if opts.min_workers is not None and opts.min_workers > n:
        raise UsageError(
            f"--min-workers {opts.min_workers} but the cluster has {n} ranks: give at most {n}"
        )
    if opts.restarts:
        cluster.engines.expect_replacements()
    run_key = f"{cluster.engines.cluster_id}-{uuid.uuid4().hex[:8]}"
    return RunController(
        cluster, program, opts, run_key=run_key, full=full, observers=observers
    ).run()


class RunController:
    """Carries one cell through its phases on ``cluster``; ``run()`` returns rank 0's value.
    ``attempt`` makes one try at the cell (the supervisor's; tests script their own)."""

    def __init__(
        self,
        cluster: Ranks,
        program: Program,
        opts: CellOptions,
        *,
        run_key: str,
        full: bool,
        observers: list[RunObserver] | None = None,
        attempt: supervisor.Attempt = supervisor.attempt,
    ):
        self.cluster = cluster
        self.attempt = attempt
        self.program = program
        self.opts = opts
        self.run_key = run_key
        self.full = full  # the cell runs on every rank
        self.observers = list(observers or ())
        self.phase = Phase.STARTING
        n = len(cluster.slots)
        self.policy = recovery.RunState(
            restarts_left=opts.restarts, world_size=n, min_workers=opts.min_workers or n
        )
        self.report = CellReport()
        self.failure = recovery.Failure.NONE
        self.decision = recovery.Decision.FINISH
        self.note = ""  # what recovery did or why it gave up, shown with the outcome
        self._before = self.policy  # the counters before the last decision

    # -- the state machine ------------------------------------------------------------------
    def _enter(self, new: Phase) -> None:
        if new not in TRANSITIONS[self.phase]:
            raise RuntimeError(f"nbdist bug: a run cannot go from {self.phase} to {new}")
        old, self.phase = self.phase, new
        for obs in self.observers:
            obs.on_phase(old, new)

    def step(self) -> Phase:
        """Do what the current phase asks and move on; the new phase."""
        if self.phase is Phase.STARTING:
            self._enter(Phase.RUNNING)
        elif self.phase is Phase.RUNNING:
            self._attempt()
        elif self.phase is Phase.RECOVERING:
            self._recover()
        return self.phase

    def run(self) -> Any:
        """Step until the run ends; then repair the cluster, journal the cell, and return rank
        0's value or raise the one error the person sees."""
        while not self.phase.terminal:
            self.step()
        return self._conclude()

    # -- phases -----------------------------------------------------------------------------
    def _attempt(self) -> None:
        """RUNNING: the cell on its ranks, to its end; then the policy's verdict."""
        self.report = self.attempt(
            self.cluster, self.program, self.opts, self.run_key, self.full, self.observers
        )
        rep = self.report
        self.failure = recovery.classify(rep.interrupted, [f.kind for f in rep.failures])
        lost = sorted(set(rep.lost))
        before = dataclasses.replace(
            self.policy, lost=len(lost), world_size=len(self.cluster.slots)
        )
        self._before = before
        self.decision, self.policy = recovery.decide(before, self.failure)
        if self.decision is recovery.Decision.FINISH:
            self._enter(Phase.FINISHED)
        elif self.decision is recovery.Decision.RAISE:
            interrupted = self.failure is recovery.Failure.INTERRUPTED
            self._enter(Phase.INTERRUPTED if interrupted else Phase.FAILED)
        else:
            self._tell("failure")
            self._enter(Phase.RECOVERING)

    def _recover(self) -> None:
        """RECOVERING: fresh engines (or fewer ranks), the journal replayed, the group re-formed."""
        lost = sorted(set(self.report.lost))
        if not lost:  # every engine lives (a full disk, say): the same ranks go again, on a
            self.cluster.group_ready = False  # fresh group, with all their names still there
            self._tell("restart")
            self._enter(Phase.RUNNING)
            return
        try:
            if self.decision is recovery.Decision.RESTART:
                try:
                    self.cluster.replace(lost)
                except NbdistError as exc:  # no engine to be had: the policy may shrink instead
                    self.decision, self.policy = recovery.decide(
                        dataclasses.replace(self._before, replaceable=False), self.failure
                    )
                    if self.decision is not recovery.Decision.SHRINK:
                        self.note = f"nbdist: no replacement engine: {exc}"
                        self._enter(Phase.FAILED)
                        return
            if self.decision is recovery.Decision.SHRINK:
                self.cluster.shrink(lost)
            replay(self.cluster, self.attempt)
        except NbdistError as exc:
            self.note = str(exc)
            self._enter(Phase.FAILED)
            return
        self._tell("restart")
        self._enter(Phase.RUNNING)

    def _tell(self, kind: str) -> None:
        """Tell observers what recovery does: each lost rank's cause, then each restart."""
        if kind == "failure":
            for f in self.report.failures:
                if not f.bystander:
                    data = {"cause": f.kind}
                    for obs in self.observers:
                        obs.on_event("failure", f.rank, f.summary, data)
            return
        done = self.policy.restarts_done
        for obs in self.observers:
            obs.on_event("restart", None, f"restart {done}: resuming", {"restarts": done})

    # -- the end ----------------------------------------------------------------------------
    def _conclude(self) -> Any:
        rep, cluster = self.report, self.cluster
        clean = not rep.failures and not rep.interrupted
        note = self.note or cluster.repair(rep.lost, rep.group_broken, self.full)
        if rep.went_on and not rep.failures:  # the cell outlived a lost rank: said, and mended
            print(note)
        if self.policy.restarts_done and clean:
            note = f"nbdist: recovered {self.policy.restarts_done} time(s)"
        if clean:
            if self.full:
                cluster.group_ready = not rep.group_broken  # the cell may have destroyed it
            cluster.journal.add_cell(self.program, self.opts.ranks, self.run_key)
        gave_up = self.failure.retryable and self.opts.restarts
        if rep.failures and gave_up and not self.note:
            note = (note + "\n" if note else "") + (
                f"nbdist: gave up after {self.opts.restarts} restart(s)"
            )
        if rep.interrupted:
            raise CellInterrupted()
        if rep.failures:
            raise DistributedCellError(rep.failures, note)
        if note and self.policy.restarts_done:
            print(note)
        return rep.value
