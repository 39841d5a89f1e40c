"""Sweeps: one cell, run once per trial, each trial on its own ranks with its own process group.

``%%distributed --sweep lr=0.1,0.01 --trial-size 1`` (or ``nbdist.sweep(cell, {"lr": [...]})``)
tiles the cluster into blocks of ``trial_size`` ranks and runs as many trials at once as there
are blocks; the rest wait in a queue. A trial's ranks form a group of their own (the block's first
engine serves its store), so ``nbdist.rank()``, ``world_size()`` and the torchrun variables
describe the trial, and the cell sees each swept name defined with the trial's value. Each trial
is a run in the store (its values in the run's options) with a headless ``RunMonitor``; the
sweep's board (``board``) shows them all.

Failure is per trial: an exception, a NaN (``--stop-on-nan``) or the median rule
(``--stop-early median``) ends that trial alone; a lost engine retires its block for the rest of
the sweep and, with ``--restarts``, its trial goes back to the head of the queue. The interrupt
stops every trial. Afterwards the world group is re-formed at the next cell, lost engines are
replaced, and the best trial's names stay pullable (``%nbdist pull NAME --trial best``).
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ...config import CellOptions
from ...errors import CellInterrupted, UsageError
from ...protocol import Program, RankInfo, TrialInfo
from ...telemetry.series import metric_values
from ...worker import api
from .. import session
from ..cluster import fanout
from ..run import programs
from ..run.monitor import RunMonitor
from ..run.replay import replay
from ..run.supervisor import CellRun
from ..trackers import sinks
from .spec import SweepSpec, label, median_rule
from .table import TrialRow, TrialTable, pull_trial

__all__ = ["Sweep", "pull_trial", "run_sweep", "sweep"]

_POLL = 0.05  # seconds between looks at the running trials (a reply wakes the loop at once)
_JUDGE_EVERY = 0.5  # seconds between applications of the stopping rule


@dataclass
class _Trial:
    """A trial as the sweep tracks it (kernel only)."""

    id: int
    values: dict[str, Any]
    state: str = "queued"  # queued, running, done, failed, stopped
    attempt: int = 0
    ranks: tuple[int, ...] = ()
    run: Any = None  # the supervisor's CellRun while running
    monitor: RunMonitor | None = None
    history: list[tuple[int, float]] = field(default_factory=list)  # (step, loss), main rank
    rate: float | None = None
    note: str = ""
    run_id: int | None = None
    stop_note: str = ""  # why the sweep stopped it
    points: list[tuple[str, int, float]] = field(default_factory=list)  # for the board, not sent

    @property
    def label(self) -> str:
        return label(self.values)

    def row(self) -> TrialRow:
        losses = [v for _, v in self.history]
        return TrialRow(
            trial=self.id,
            values=dict(self.values),
            state=self.state,
            ranks=self.ranks,
            step=self.history[-1][0] if self.history else None,
            loss=losses[-1] if losses else None,
            best=min(losses) if losses else None,
            samples_per_s=self.rate,
            note=self.note,
            run_id=self.run_id,
        )


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
        n = len(cluster.slots)
        spec.check_cluster(n)
        if opts.ranks is not None:
            raise UsageError("--ranks and --sweep do not mix: a sweep uses every rank")
        self.cluster, self.program, self.spec, self.opts = cluster, program, spec, opts
        self.name = spec.name or f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"
        self._run = uuid.uuid4().hex[:8]  # this sweep's run: its trials' checkpoints are theirs
        self.trials = [_Trial(i, values) for i, values in enumerate(spec.trials())]
        k = spec.trial_size
        self.free: deque[tuple[int, ...]] = deque(
            tuple(range(b * k, (b + 1) * k)) for b in range(n // k)
        )
        self.queue: deque[_Trial] = deque(self.trials)
        self.lost: set[int] = set()
        self.board = board
        self._wake = threading.Event()
        self._last_judged = 0.0

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> TrialTable:
        """Run every trial (queued ones as blocks free up); the table of trials."""
        cl = self.cluster
        fanout.call(
            cl.client, {s.rank: s.engine_id for s in cl.slots}, api.forget_trials, timeout=30
        )
        cl.group_ready = False  # the trials' groups replace the world's: re-formed after
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
                elif self.queue and not self.free:  # every block lost an engine
                    for t in self.queue:
                        t.state, t.note = "failed", "not run: no whole block of ranks was left"
                    self.queue.clear()
        except BaseException as exc:  # the interrupt, or nbdist failing: end every trial
            interrupted = isinstance(exc, KeyboardInterrupt)
            for t in self._running():
                t.run.interrupt()
                self._end(t, t.run.finish(), interrupted=True)
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
        return [t for t in self.trials if t.state == "running"]

    def _launch(self) -> None:
        while self.queue and self.free:
            t, ranks = self.queue.popleft(), self.free.popleft()
            try:
                groups = self._groups(ranks)
            except Exception as exc:  # e.g. the block's first engine died while idle
                self._not_started(t, ranks, fanout.one_line(exc))
                continue
            t.ranks, t.state, t.note, t.history, t.points = ranks, "running", "", [], []
            opts = dataclasses.replace(
                self.opts,
                ranks=ranks,
                extra={**self.opts.extra, "sweep": self.name, "trial": t.id, "values": t.values},
            )
            t.monitor = RunMonitor(
                self.cluster,
                self.program.source,
                opts,
                name=self.name,
                label=f"trial {t.id}: {t.label}",
                world_size=len(ranks),
                dashboard=False,
                total=self.opts.extra.get("total"),
                stop_on_nan=bool(self.opts.extra.get("stop_on_nan")),
                track=self.opts.extra.get("track"),  # each trial a tracker run, grouped
            )
            t.run_id = t.monitor.run_id
            self._follow(t)
            info = TrialInfo(self.name, t.id, dict(t.values), t.attempt)
            t.run = CellRun(
                self.cluster,
                self.program,
                opts,
                groups,
                f"{self.name}-{t.id}",  # the trial's checkpoints: its own folder
                [t.monitor],
                trial=info,
                wake=self._wake,
                run_id=f"{self.name}-{t.id}-{self._run}",  # earlier sweeps' move aside
            )

    def _not_started(self, t: _Trial, ranks: tuple[int, ...], why: str) -> None:
        """A trial whose group could not be set up: a block with a lost engine is retired and
        the trial waits for another; otherwise the trial fails, in one line."""
        cl = self.cluster
        exited, alive = cl.drain_exits(), set(cl.client.ids)
        lost = [r for r in ranks if cl.slots[r].pid in exited or cl.slots[r].engine_id not in alive]
        if lost:
            self.lost.update(lost)
            self.queue.appendleft(t)
            return
        t.state, t.note = "failed", f"not started: {why}"
        self.free.append(ranks)

    def _groups(self, ranks: tuple[int, ...]) -> dict[int, RankInfo]:
        """The trial's group: its ranks numbered from 0, on a store of its own that its first
        engine serves (never the world's, whose clients must not meet the trial's)."""
        cl = self.cluster
        infos = cl.rank_infos()
        first = cl.slots[ranks[0]]
        addr = cl.engines.address_of(first.engine_id)
        port = cl.client[first.engine_id].apply_sync(api.serve_store, addr, True)
        cl.attempt += 1
        return {
            r: dataclasses.replace(
                infos[r],
                rank=i,
                world_size=len(ranks),
                master_addr=addr,
                master_port=port,
                attempt=cl.attempt,
            )
            for i, r in enumerate(ranks)
        }

    def _follow(self, t: _Trial) -> None:
        """Keep the trial's main-rank losses (for the stopping rule) and every metric it
        reports (for the board) as its monitor folds them."""
        col, main = t.monitor.collector, t.ranks[0]
        fold = col.on_records

        def on_records(rank: int, recs: list) -> None:
            fold(rank, recs)
            if rank != main:
                return
            for rec in recs:
                if rec.step is None:
                    continue
                values = metric_values(rec.loss, rec.extra)
                if "loss" in values:
                    t.history.append((rec.step, values["loss"]))
                t.points.extend((name, rec.step, v) for name, v in values.items())

        col.on_records = on_records

    def _step(self, t: _Trial) -> None:
        try:
            done = t.run.step()
        except KeyboardInterrupt:
            if t.monitor.stop_reason is None:  # the person's interrupt: the whole sweep
                raise
            t.stop_note = f"stopped: {t.monitor.stop_reason.summary}"
            t.run.interrupt()
            done = True
        if done:
            self._end(t, t.run.finish())
        else:
            t.rate = t.monitor.collector.samples_per_s() or t.rate

    def _judge(self) -> None:
        """Apply the stopping rule to the running trials, twice a second."""
        now = time.monotonic()
        if self.spec.stop_early != "median" or now - self._last_judged < _JUDGE_EVERY:
            return
        self._last_judged = now
        for t in self._running():
            others = [o.history for o in self.trials if o is not t]
            why = median_rule(t.history, others, self.spec.grace)
            if why is not None:
                t.stop_note = why
                t.run.interrupt()
                self._end(t, t.run.finish())

    def _end(self, t: _Trial, report: Any, interrupted: bool = False) -> None:
        """A trial's cell has ended: its state, its note, its block back (or retired)."""
        lost = sorted(set(report.lost))
        self.lost.update(lost)
        failures = [f for f in report.failures if not f.bystander]
        if t.stop_note:
            t.state, t.note, status = "stopped", t.stop_note, "stopped"
        elif interrupted or report.interrupted:
            t.state, t.note, status = "stopped", "interrupted", "interrupted"
        elif lost and t.attempt < self.opts.restarts:
            t.state, status = "queued", "failed"
            t.attempt += 1
            why = (failures or report.failures)[0].summary
            t.note = f"rank(s) {lost} lost ({why}); restarting, attempt {t.attempt}"
            self.queue.appendleft(t)
        elif report.failures:
            first = failures[0] if failures else report.failures[0]
            t.state, status = "failed", "failed"
            t.note = f"rank {t.ranks.index(first.rank)}: {first.summary}"
        else:
            t.state, status = "done", "ok"
        failed = [{"rank": f.rank, "summary": f.summary, "kind": f.kind} for f in failures]
        t.monitor.close(status, failed)
        t.rate = t.monitor.collector.samples_per_s() or t.rate
        t.run = None
        if not lost:
            self._keep_best(t.ranks)
            self.free.append(t.ranks)

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
            self.board.add_reports(t.id, t.points, t.rate)
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
        self._keep_best(s.rank for s in cl.slots if s.rank not in self.lost)
        cl.last_sweep = table
        if self.board is not None:
            self._show(force=True)
            self.board.finish(status)
        if self.lost:
            cl.replace(sorted(self.lost))
            note = f"nbdist: rank(s) {sorted(self.lost)} got fresh engines"
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
    telemetry = {k: options.pop(k) for k in ("total", "stop_on_nan", "track") if k in options}
    opts = CellOptions(**options, extra=telemetry)
    return run_sweep(programs.cell(cell), spec, opts, board)


def run_sweep(program: Program, spec: SweepSpec, opts: CellOptions, board: bool) -> TrialTable:
    """The sweep of ``program`` on the current cluster, with its board when ``board``."""
    cluster = session.current()
    sinks.check(sinks.names(opts.extra.get("track")))  # before any trial: one line
    shown = None
    if board:
        from .board import SweepBoard

        shown = SweepBoard(f"sweep {spec.name or ''}".strip())
    return Sweep(cluster, program, spec, opts, shown).run()
