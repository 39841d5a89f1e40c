"""A run from start to end: its cell on its ranks, and when a worker is lost, recovery.

A run is a plain ``%%distributed`` cell (or script) or one trial of a sweep: both go through
this controller, the supervisor and the pure recovery policy; what differs is the run's
``formation.Formation`` (where the cell runs, how the cluster is mended). The run is a small
state machine. Its phases (``observers.base.Phase``) change only along ``TRANSITIONS``, in one
place (``_enter``), and every change is told to the run's watch (``observers.watch.Watch``)::

    STARTING ──> RUNNING ──> FINISHED
                  │  ^  └──> FAILED | INTERRUPTED
                  v  │
               RECOVERING ──> FAILED   (no engine to replace a lost one, or replay failed)

``step()`` does one thing and returns at once: RUNNING sends the cell to its ranks, then looks
at them once per step (``supervisor.CellRun.step``) until no rank runs, and asks the policy
(``recovery.decide``) what a failure means; RECOVERING asks the formation to carry the decision
out (it may wait, for a sweep's block to free up). ``run()`` steps one run to its end with the
supervisor's pause between looks; a sweep steps its trials' controllers in turn. The controller
decides nothing itself: it carries out the policy's decisions. At the end it closes the watch
with how the run ended, and returns rank 0's value or raises the one error the person sees.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Callable
from typing import Any

from ...config import CellOptions
from ...errors import CellInterrupted, DistributedCellError, NbdistError, UsageError
from ...protocol import Program
from ..cluster.ranks import Ranks
from . import recovery
from .formation import Formation, World
from .observers.base import Phase
from .observers.watch import Watch
from .outcomes import CellReport
from .supervisor import CellRun, Launch

#: The phases that may follow each phase; ``tests/unit/test_recovery_policy.py`` checks them.
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.STARTING: frozenset({Phase.RUNNING, Phase.FAILED}),
    Phase.RUNNING: frozenset({Phase.FINISHED, Phase.FAILED, Phase.INTERRUPTED, Phase.RECOVERING}),
    Phase.RECOVERING: frozenset({Phase.RUNNING, Phase.FAILED}),
    Phase.FINISHED: frozenset(),
    Phase.FAILED: frozenset(),
    Phase.INTERRUPTED: frozenset(),
}

#: Sends one attempt at a cell and returns it running (``supervisor.CellRun``; tests script it).
Start = Callable[[Ranks, Launch], Any]


def check(cluster: Ranks, opts: CellOptions) -> None:
    """A cell's options against the cluster: one line for what cannot be run."""
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


def run(cluster: Ranks, program: Program, opts: CellOptions, watch: Watch | None = None) -> Any:
    """Run ``program`` on ``cluster``'s ranks (``opts.ranks``, or every rank) to its end,
    recovering as ``opts`` allows, watched by ``watch`` (closed at the end): rank 0's value, or
    the one error the person sees."""
    try:
        check(cluster, opts)
    except UsageError:
        if watch is not None:
            watch.close("failed", recorded=False)  # it never reached the engines
        raise
    cluster.engines.expect_replacements()  # once: a lost rank's engine starts warm
    run_key = f"{cluster.engines.cluster_id}-{uuid.uuid4().hex[:8]}"
    world = World(cluster, opts)
    return RunController(cluster, program, opts, world, run_key=run_key, watch=watch).run()


class RunController:
    """Carries one run through its phases (see the module's text); ``run()`` returns rank 0's
    value. ``start`` sends an attempt (the supervisor's ``CellRun``; tests script their own)."""

    def __init__(
        self,
        cluster: Ranks,
        program: Program,
        opts: CellOptions,
        formation: Formation,
        *,
        run_key: str,
        run_id: str = "",
        watch: Watch | None = None,
        wake: threading.Event | None = None,
        start: Start = CellRun,
    ):
        self.cluster = cluster
        self.program = program
        self.opts = opts
        self.formation = formation
        self.run_key = run_key
        self.run_id = run_id
        self.watch = watch
        self.wake = wake  # set when a rank answers (a sweep shares one among its trials)
        self.start = start
        self.phase = Phase.STARTING
        n = len(formation.ranks())
        self.policy = recovery.RunState(
            restarts_left=opts.restarts, world_size=n, min_workers=opts.min_workers or n
        )
        self.cell: Any = None  # the attempt in flight (a CellRun), if any
        self.report = CellReport()
        self.failure = recovery.Failure.NONE
        self.decision = recovery.Decision.FINISH
        self.note = ""  # what recovery did or why it gave up, shown with the outcome
        self.stopped = ""  # why the caller's rule stopped it (a sweep's), if it did
        self._before = self.policy  # the counters before the last decision

    # -- the state machine ------------------------------------------------------------------
    def _enter(self, new: Phase) -> None:
        if new not in TRANSITIONS[self.phase]:
            raise RuntimeError(f"nbdist bug: a run cannot go from {self.phase} to {new}")
        old, self.phase = self.phase, new
        if self.watch is not None:
            self.watch.on_phase(old, new)

    def step(self) -> Phase:
        """Do what the current phase asks, without waiting; the phase after."""
        if self.phase is Phase.STARTING:
            self._enter(Phase.RUNNING)
        elif self.phase is Phase.RUNNING:
            if self.cell is None:
                self.cell = self.start(self.cluster, self._launch())
            elif self.cell.step():
                self._ended(self.cell.finish())
        elif self.phase is Phase.RECOVERING:
            self._recover()
        return self.phase

    def pause(self) -> None:
        """Wait for the next look at the cell in flight (a reply ends the wait at once)."""
        if self.cell is not None:
            self.cell.pause()

    def interrupt(self) -> None:
        """Stop the cell in flight on every rank (the interrupt button; a sweep's rule): the
        run ends interrupted, or as its stop says."""
        if self.cell is not None:
            self.cell.interrupt()
            self._ended(self.cell.finish())

    def stop(self, why: str) -> None:
        """End the run on every rank by the caller's rule (a sweep's median rule): it ends
        stopped, ``why`` its note."""
        self.stopped = self.note = why
        self.interrupt()

    def run(self) -> Any:
        """Step to the end, pausing between looks; then close the watch, mend the cluster,
        and return rank 0's value or raise the one error the person sees."""
        try:
            while not self.phase.terminal:
                try:
                    self.step()
                    self.pause()
                except KeyboardInterrupt:
                    if self.cell is None:  # not in a cell (recovering): the run ends here
                        raise
                    self.interrupt()
        except BaseException as exc:
            if self.watch is not None:
                interrupted = isinstance(exc, KeyboardInterrupt)
                self.watch.close("interrupted" if interrupted else "failed")
            raise
        return self.conclude()

    # -- phases -----------------------------------------------------------------------------
    def _launch(self) -> Launch:
        trial = self.formation.trial
        if trial is not None:  # a trial says which attempt it is (nbdist.trial().attempt)
            trial = dataclasses.replace(trial, attempt=self.policy.restarts_done)
        return Launch(
            self.program,
            self.opts,
            self.formation.ranks(),
            self.formation.groups(),
            self.run_key,
            self.run_id,
            self.watch,
            trial,
            self.wake,
            rebind=self.formation.whole,
        )

    def _ended(self, report: CellReport) -> None:
        """The attempt ended: the policy's verdict on it."""
        self.cell, self.report = None, report
        kinds = [f.kind for f in report.failures]
        self.failure = recovery.classify(report.interrupted, kinds)
        if report.stopped is not None:  # an observer stopped it: the person's rule, not a loss
            self.failure = recovery.Failure.APP_ERROR
        before = dataclasses.replace(
            self.policy, lost=len(set(report.lost)), world_size=len(self.formation.ranks())
        )
        self._before = before
        self.decision, self.policy = recovery.decide(before, self.failure)
        if self.decision is recovery.Decision.FINISH:
            self._enter(Phase.FINISHED)
        elif self.decision is recovery.Decision.RAISE:
            interrupted = self.failure is recovery.Failure.INTERRUPTED
            self._enter(Phase.INTERRUPTED if interrupted else Phase.FAILED)
        else:
            self._tell_failures()
            self._enter(Phase.RECOVERING)

    def _recover(self) -> None:
        """RECOVERING: the formation carries the decision out (fresh engines, fewer ranks, or
        another block); back to RUNNING once it has, or FAILED when it cannot."""
        lost = sorted(set(self.report.lost))
        try:
            try:
                mended = self.formation.mend(self.decision, lost)
            except NbdistError as exc:
                if self.decision is not recovery.Decision.RESTART or not lost:
                    raise
                # no engine to be had: the policy may shrink instead
                self.decision, self.policy = recovery.decide(
                    dataclasses.replace(self._before, replaceable=False), self.failure
                )
                if self.decision is not recovery.Decision.SHRINK:
                    self.note = f"nbdist: no replacement engine: {exc}"
                    self._enter(Phase.FAILED)
                    return
                mended = self.formation.mend(self.decision, lost)
        except NbdistError as exc:
            self.note = str(exc)
            self._enter(Phase.FAILED)
            return
        if mended:
            if self.watch is not None:
                done = self.policy.restarts_done
                self.watch.on_event(
                    "restart", None, f"restart {done}: resuming", {"restarts": done}
                )
            self._enter(Phase.RUNNING)

    def _tell_failures(self) -> None:
        """Tell the watch each lost rank's cause, before recovery."""
        if self.watch is None:
            return
        for f in self.report.failures:
            if not f.bystander:
                self.watch.on_event("failure", f.rank, f.summary, {"cause": f.kind})

    # -- the end ----------------------------------------------------------------------------
    def status(self) -> str:
        """How the run ended, as the run store says it: ok, stopped, interrupted or failed."""
        rep = self.report
        if self.phase is Phase.FINISHED:
            return "ok"
        if rep.stopped is not None or self.stopped:
            return "stopped"
        return "interrupted" if self.phase is Phase.INTERRUPTED else "failed"

    def failures(self) -> list:
        """The failures the run ended with (its stop's reason first, when an observer
        stopped it)."""
        rep = self.report
        if rep.stopped is not None:
            return [rep.stopped.reason]
        return list(rep.failures) if not rep.interrupted else []

    def close(self) -> str:
        """The run ended: close the watch with how, let the formation mend the cluster and keep
        what it keeps; the line to show with the outcome ("" for none)."""
        if self.watch is not None:
            self.watch.close(self.status(), self.failures())
        clean = self.phase is Phase.FINISHED
        return self.note or self.formation.settle(self.program, self.report, clean, self.run_key)

    def conclude(self) -> Any:
        """``close``, then rank 0's value, or the one error the person sees."""
        rep = self.report
        note = self.close()
        clean = self.phase is Phase.FINISHED
        if rep.went_on and not rep.failures:  # the cell outlived a lost rank: said, and mended
            print(note)
        if self.policy.restarts_done and clean:
            note = f"nbdist: recovered {self.policy.restarts_done} time(s)"
        if rep.stopped is not None:
            raise DistributedCellError([rep.stopped.reason], f"nbdist: {rep.stopped.note}")
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
