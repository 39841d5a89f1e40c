"""Sweeps: one cell, run once per trial, each trial on its own ranks with its own process group.

``%%distributed --sweep lr=0.1,0.01 --trial-size 1`` (or ``nbdist.sweep(cell, {"lr": [...]})``)
tiles the cluster into blocks of ``trial_size`` ranks (``blocks``) and runs as many trials at
once as there are blocks; the rest wait in a queue. Each trial is a run like a plain cell's: the
same controller, supervisor and recovery policy (``run.controller``), its own attempts, its own
watch (the run store, trackers, ``--stop-on-nan``: ``run.observers.assembly``) and one more
observer (``TrialFeed``) that feeds the sweep's stopping rule and its board (``board``). What
differs is the trial's formation (``blocks.Block``): its block's ranks, numbered from 0 in a
group of their own, so ``nbdist.rank()``, ``world_size()`` and the torchrun variables describe
the trial, and the cell sees each swept name defined with the trial's value.

Failure is per trial: an exception, a NaN (``--stop-on-nan``) or the median rule
(``--stop-early median``) ends that trial alone; a lost engine retires its block for the rest of
the sweep and, with ``--restarts``, its trial waits for another block and resumes there. The
interrupt stops every trial. Afterwards the world group is re-formed at the next cell, lost
engines are replaced, and the best trial's names stay pullable (``%nbdist pull NAME --trial
best``).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ...config import CellOptions
from ...errors import CellInterrupted, NbdistError, UsageError
from ...protocol import Program, TrialInfo
from ...telemetry.events import MetricRecord
from ...telemetry.series import metric_values
from ...worker import api
from .. import session
from ..cluster import fanout
from ..run import programs
from ..run.controller import RunController
from ..run.observers.assembly import assemble
from ..run.observers.base import Observer, Phase, Tick
from ..run.replay import replay
from ..trackers import sinks
from .blocks import Block, Blocks
from .spec import SweepSpec, label
from .stopping import LossHistory, median_rule
from .table import TrialRow, TrialTable, keep, pull_trial

__all__ = ["Sweep", "pull_trial", "run_sweep", "sweep"]

_POLL = 0.05  # seconds between looks at the running trials (a reply wakes the loop at once)


@dataclass
class _Trial:
    """A trial as the sweep tracks it (kernel only): its row's facts, and its run once started."""

    id: int
    values: dict[str, Any]
    state: str = "queued"  # queued, running, done, failed, stopped
    ranks: tuple[int, ...] = ()
    run: RunController | None = None  # from its start to its end
    history: LossHistory = field(default_factory=LossHistory)  # its main rank's losses
    rate: float | None = None
    note: str = ""
    run_id: int | None = None
    stop_note: str = ""  # why the sweep's rule stopped it
    judged: int = 0  # reports in its history when the stopping rule last looked
    points: list[tuple[str, int, float]] | None = None  # for the board (when one), not sent

    @property
    def label(self) -> str:
        return label(self.values)

    def row(self) -> TrialRow:
        h = self.history
        return TrialRow(
            trial=self.id,
            values=dict(self.values),
            state=self.state,
            ranks=self.ranks,
            step=h.last_step,
            loss=h.last,
            best=h.best,
            samples_per_s=self.rate,
            note=self.note,
            run_id=self.run_id,
        )


class TrialFeed(Observer):
    """What a sweep takes from a trial's run: its main rank's losses (for the stopping rule)
    and every metric it reports (for the board), and its samples/s."""

    def __init__(self, trial: _Trial):
        self.trial = trial

    def on_records(self, rank: int, records: list[MetricRecord]) -> None:
        t = self.trial
        if not t.ranks or rank != t.ranks[0]:
            return
        for rec in records:
            if rec.step is None:
                continue
            values = metric_values(rec.loss, rec.extra)
            if "loss" in values:
                t.history.add(rec.step, values["loss"])
            if t.points is not None:
                t.points.extend((name, rec.step, v) for name, v in values.items())

    def on_tick(self, tick: Tick) -> None:
        self.trial.rate = tick.live.samples_per_s() or self.trial.rate


class Sweep:
    """One sweep of ``program`` over ``spec``'s trials on ``cluster`` (see the module's text)."""

    def __init__(
        self,
        cluster: Any,
        program: Program,
        spec: SweepSpec,
        opts: CellOptions,
        board: Any = None,
    ) -> None:
        spec.check_cluster(len(cluster.slots))
        if opts.ranks is not None:
            raise UsageError("--ranks and --sweep do not mix: a sweep uses every rank")
        self.cluster, self.program, self.spec, self.opts = cluster, program, spec, opts
        self.name = spec.name or f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"
        self._run = uuid.uuid4().hex[:8]  # this sweep's run: its trials' checkpoints are theirs
        drawn = board is not None  # the points for the board: none kept when nobody draws
        self.trials = [
            _Trial(i, v, points=[] if drawn else None) for i, v in enumerate(spec.trials())
        ]
        self.blocks = Blocks(cluster, spec.trial_size)
        self.queue: deque[_Trial] = deque(self.trials)
        self.board = board
        self._wake = threading.Event()

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> TrialTable:
        """Run every trial (queued ones as blocks free up); the table of trials."""
        cl = self.cluster
        fanout.call(
            cl.client, {s.rank: s.engine_id for s in cl.slots}, api.forget_trials, timeout=30
        )
        cl.note_group(False)  # the trials' groups replace the world's: re-formed after
        if self.board is not None:
            self.board.show()
        try:
            while self.queue or self._running():
                self._launch()
                for t in self._running():
                    self._step(t)
                self._judge()
                self._show()
                if self._running():
                    self._wake.wait(_POLL)
                    self._wake.clear()
                elif self.queue and self.blocks.exhausted():  # every block lost an engine
                    for t in self.queue:
                        t.state, t.note = "failed", "not run: no whole block of ranks was left"
                    self.queue.clear()
        except BaseException as exc:  # the interrupt, or nbdist failing: end every trial
            interrupted = isinstance(exc, KeyboardInterrupt)
            for t in self._running():
                t.run.interrupt()
                self._end(t)
            for t in self.queue:
                why = "interrupted" if interrupted else f"stopped ({type(exc).__name__})"
                t.state, t.note = "stopped", f"not run: the sweep was {why}"
            self._finish("interrupted" if interrupted else "failed")
            if interrupted:
                raise CellInterrupted() from None
            raise
        self._finish("ok")
        return TrialTable(self.name, [t.row() for t in self.trials])

    def _running(self) -> list[_Trial]:
        return [t for t in self.trials if t.run is not None]

    def _launch(self) -> None:
        """Start queued trials on the free blocks, in order, while there are some."""
        while self.queue:
            t = self.queue[0]
            info = TrialInfo(self.name, t.id, dict(t.values))
            formation = Block(self.blocks, info)
            try:
                if not formation.place():
                    return
            except NbdistError as exc:  # its group could not be made there
                self.queue.popleft()
                t.state, t.note = "failed", str(exc)
                continue
            self.queue.popleft()
            t.ranks, t.state = formation.block, "running"
            cl = self.cluster
            watch = assemble(
                self.program.source,
                self.opts,
                formation.block,
                cluster_id=str(getattr(cl.engines, "cluster_id", "") or ""),
                trial=info,
                label=f"trial {t.id}: {t.label}",
                extra=[TrialFeed(t)],
            )
            t.run_id = watch.run_id
            t.run = RunController(
                cl,
                self.program,
                self.opts,
                formation,
                run_key=f"{self.name}-{t.id}",  # the trial's checkpoints: its own folder
                run_id=f"{self.name}-{t.id}-{self._run}",  # earlier sweeps' move aside
                watch=watch,
                wake=self._wake,
            )

    def _step(self, t: _Trial) -> None:
        """One step of a trial's run; its row follows its phase."""
        run = t.run
        phase = run.step()
        if phase.terminal:
            self._end(t)
        elif phase is Phase.RECOVERING and t.state == "running":
            lost = sorted(set(run.report.lost))
            why = next((f.summary for f in run.report.failures if not f.bystander), "")
            done = run.policy.restarts_done
            t.state = "queued"
            t.note = f"rank(s) {lost} lost ({why}); restarting, attempt {done}"
        elif phase is Phase.RUNNING and t.state == "queued":
            t.state, t.ranks = "running", run.formation.ranks()

    def _judge(self) -> None:
        """Apply the stopping rule to each running trial whose losses came since it last
        looked (a batch of them, about twice a second): a hopeless trial stops as soon as its
        reports say so."""
        if self.spec.stop_early != "median":
            return
        for t in self._running():
            if t.history.reports == t.judged:
                continue
            t.judged = t.history.reports
            others = [o.history for o in self.trials if o is not t]
            why = median_rule(t.history, others, self.spec.grace)
            if why is not None:
                t.stop_note = why
                t.run.stop(why)
                self._end(t)

    def _end(self, t: _Trial) -> None:
        """A trial's run has ended: its state and note, its watch closed, its block back (or
        retired), and its engines keep only the best trial's names."""
        run, t.run = t.run, None
        report = run.report
        failures = [f for f in report.failures if not f.bystander] or report.failures
        status = run.status()
        if t.stop_note:
            t.state, t.note = "stopped", t.stop_note
        elif report.stopped is not None:
            t.state, t.note = "stopped", f"stopped: {report.stopped.reason.summary}"
        elif status == "interrupted":
            t.state, t.note = "stopped", "interrupted"
        elif status == "failed":
            first = failures[0] if failures else None
            t.state = "failed"
            t.note = run.note or (
                f"rank {t.ranks.index(first.rank)}: {first.summary}" if first else ""
            )
        else:
            t.state = "done"
        run.close()
        if not report.lost:
            self._keep_best(t.ranks)

    # -- the end ----------------------------------------------------------------------------
    def _show(self, force: bool = False) -> None:
        if self.board is None:
            return
        for t in self.trials:
            r = t.row()
            self.board.set_trial(
                t.id,
                label=t.label,
                state=t.state,
                ranks=",".join(map(str, t.ranks)),
                step=r.step,
                loss=r.loss,
                best=r.best,
                samples_per_s=r.samples_per_s,
                note=t.note,
            )
            self.board.add_reports(t.id, t.points or [], t.rate)
            if t.points:
                t.points.clear()
        self.board.update(force)

    def _keep_best(self, ranks: Iterable[int]) -> None:
        """The engines of ``ranks`` drop the names of every ended trial but the best so far:
        however long the sweep, an engine holds one kept trial's names besides its own."""
        ended = [t.row() for t in self.trials if t.state in ("done", "failed", "stopped")]
        best = TrialTable(self.name, ended).best(1)
        keep = (best[0].trial,) if best else ()
        engines = {r: self.cluster.slots[r].engine_id for r in ranks}
        fanout.call(self.cluster.client, engines, api.forget_trials, keep, timeout=30)

    def _finish(self, status: str) -> None:
        cl = self.cluster
        table = TrialTable(self.name, [t.row() for t in self.trials])
        lost = sorted(self.blocks.lost)
        self._keep_best(s.rank for s in cl.slots if s.rank not in lost)
        keep(cl, table)
        if self.board is not None:
            self._show(force=True)
            self.board.finish(status)
        if lost:
            cl.replace(lost)
            note = f"nbdist: rank(s) {lost} got fresh engines"
            if self.opts.restarts:
                replay(cl)
                note += "; earlier cells were replayed there"
            print(note)


def sweep(
    cell: str,
    params: dict[str, Any],
    trial_size: int = 1,
    *,
    samples: int | None = None,
    seed: int = 0,
    stop_early: str | None = None,
    name: str = "",
    board: bool = True,
    **options: Any,
) -> TrialTable:
    """Run ``cell`` once per trial of ``params`` (``{"lr": [0.1, 0.01]}``: the grid; ranges as
    ``spec.Range`` with ``samples``), each trial on ``trial_size`` ranks of the current
    cluster; ``%%distributed --sweep`` from Python. ``options`` are ``%%distributed``'s
    (``restarts``, ``timeout``, ``total``, ``stop_on_nan``, ``track="mlflow"``: each trial a
    tracker run, grouped under the sweep...). Returns the table of trials."""
    from .spec import parse_values

    parsed = {k: parse_values(k, v) if isinstance(v, str) else v for k, v in dict(params).items()}
    spec = SweepSpec(parsed, trial_size, samples, seed, stop_early, name)
    opts = CellOptions(**options, name=name, dashboard=board)
    return run_sweep(programs.cell(cell), spec, opts)


def run_sweep(program: Program, spec: SweepSpec, opts: CellOptions) -> TrialTable:
    """The sweep of ``program`` on the current cluster, with its board unless
    ``opts.dashboard`` is False."""
    cluster = session.current()
    sinks.check(opts.track)  # before any trial: one line
    shown = None
    if opts.dashboard:
        from .board import SweepBoard

        shown = SweepBoard(f"sweep {spec.name or ''}".strip())
    return Sweep(cluster, program, spec, opts, shown).run()
