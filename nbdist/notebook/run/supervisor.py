"""Run one ``%%distributed`` cell on every rank and watch it until it ends, one way or another.

The cell is sent to all ranks at once (non-blocking), then watched in one loop that streams
output, notices failures and engine deaths, and enforces the deadline. One rank's failure ends the
cell within seconds: the failing rank leaves the process group itself (its peers' collectives fail
at once), and ranks still busy after ``grace`` seconds are interrupted; ranks that do not stop
within ``stop_wait`` seconds are killed and their engines replaced. The interrupt button takes
the same road, and so does an observer's request to stop (``--stop-on-nan``). A ``CellRun`` is one
try at a cell (``Launch``), stepped by the run's controller (``step``, ``pause``, ``finish``) or
waited for whole (``wait``: the journal's replay); a sweep steps its trials' in turn.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from ...config import CellOptions
from ...errors import RankFailure
from ...protocol import CellOutcome, CellRequest, Program, RankInfo, TrialInfo
from ...worker import api
from ..cluster import fanout
from ..cluster.ranks import Ranks
from ..debug import stacks
from . import collisions, outcomes, survivors
from .interrupts import holding
from .observers.watch import Watch
from .outcomes import CellReport, RankRun
from .output import InRankOrder, RankStreams, shows_output_of

_POLL = 0.02  # seconds between looks at the ranks while output flows (what a person sees)
_IDLE_POLL = 0.5  # ...and otherwise: telemetry is read as often as it comes (and drawn)
_ACTIVE_FOR = 1.0  # seconds after the last news that count as "flowing"
_OUTPUT_WAIT = 2.0  # seconds to wait for a finished rank's last output to arrive
_LONE_WAIT = 2.0  # seconds ranks may run on after a peer ended before nbdist looks at them
_LONE_LOOK_MAX = 30.0  # ...and, while they compute, the longest it waits to look again


@dataclass(frozen=True)
class Launch:
    """One attempt at a cell, as the run's controller asks for it: the cluster's ranks it runs
    on, the group they form as it starts (``{}``: the standing one), who watches it."""

    program: Program
    opts: CellOptions
    ranks: tuple[int, ...]
    groups: dict[int, RankInfo]
    run_key: str = "default"
    run_id: str = ""
    watch: Watch | None = None
    trial: TrialInfo | None = None
    wake: threading.Event | None = None  # set at a reply (a sweep shares one among its trials)
    rebind: bool = False  # it runs on every rank of the world: earlier objects are bound again


class CellRun:
    """One cell on a set of ranks, from sending to the last output line (``Launch``)."""

    def __init__(self, cluster: Ranks, launch: Launch):
        self.cluster = cluster
        self.opts = opts = launch.opts
        self.program = launch.program
        self.watch = launch.watch
        ranks = list(launch.ranks)
        self.main_rank = ranks[0]
        trial = launch.trial
        self.prefix = f"[trial {trial.trial}] " if trial is not None else ""
        self.report = CellReport()
        self._t0 = time.monotonic()
        self._deadline = self._t0 + opts.timeout if opts.timeout else None
        self._first_failure: float | None = None
        self._timed_out = False
        self._ended_at: float | None = None  # when a rank ended its cell well, others running
        self._lone_look = _LONE_WAIT  # seconds after that before looking (doubled each look)
        self._mismatch: RankFailure | None = None  # ranks ran different collectives: why
        self._in_order = InRankOrder() if opts.all_output else None
        self._wake = launch.wake or threading.Event()
        # quiet until the first line: a cell that prints nothing is looked at as often as
        # its board is drawn, and a reply wakes the loop at once all the same
        self._news = False
        self._quiet_since = self._t0 - _ACTIVE_FOR
        self.ranks: dict[int, RankRun] = {}
        calls = {}
        for r in ranks:
            slot = cluster.slots[r]
            gone = self._gone(slot)
            if gone:  # died since the last cell: a death like one during the cell
                self.ranks[r] = RankRun(
                    r,
                    slot.engine_id,
                    slot.pid,
                    fanout.Unsent(slot.engine_id),
                    outcomes.lost("died", gone),
                )
                continue
            request = CellRequest(
                program=launch.program,
                options=opts,
                run_key=launch.run_key,
                run_id=launch.run_id,
                group=launch.groups.get(r),
                want_value=r == self.main_rank,
                group_timeout=cluster.cfg.group_timeout,
                trial=trial,
                telemetry=self.watch is not None,  # what the ranks send, only if it is read
                rebind=launch.rebind,
            )
            calls[r] = (slot.engine_id, (request,))
        self._unanswered = len(calls)
        self._count = threading.Lock()
        for r, ar in fanout.submit_each(cluster.client, api.run_cell, calls).items():
            slot = cluster.slots[r]
            self.ranks[r] = RankRun(r, slot.engine_id, slot.pid, ar, None, ar.metadata)
            ar.add_done_callback(self._replied)  # from ipyparallel's I/O thread

    def _replied(self, ar) -> None:
        """A rank answered (ipyparallel's I/O thread): the loop is woken when it must act, at a
        failure or at the last reply, not at every rank's success."""
        with self._count:
            self._unanswered -= 1
            last = self._unanswered <= 0
        try:
            failed = ar.get(0).kind != "ok"
        except Exception:  # the engine's error, or an Unsent's EngineGone: a failure
            failed = True
        if last or failed:
            self._wake.set()

    def _gone(self, slot) -> str:
        """Why the engine of ``slot`` can't take the cell (exited, dropped), or "" if it can."""
        ex = self.cluster.drain_exits().get(slot.pid)
        if ex is not None:
            return f"engine process {ex.describe()} (pid {ex.pid}) before the cell"
        if slot.engine_id not in self.cluster.client.ids:
            return f"engine {slot.engine_id} (pid {slot.pid}) was gone before the cell"
        return ""

    # -- output ---------------------------------------------------------------------------
    def _visible(self, r: int) -> bool:
        return shows_output_of(self.opts, r, self.main_rank)

    def _stream(self, rk: RankRun, final: bool = False) -> None:
        if rk.streams is None:
            shown = self._visible(rk.rank)
            label = f"[rank {rk.rank}] " if self.opts.all_output else ""
            sink = self._in_order.sink(rk.rank) if self._in_order else None
            rk.streams = RankStreams(self.prefix + label if shown else None, sink)
        if rk.streams.read(rk.metadata, final):  # filled in as iopub messages arrive
            self._news = True

    # -- watching -------------------------------------------------------------------------
    def _collect(self, rk: RankRun) -> None:
        """Record the outcome of a rank whose result has arrived."""
        try:
            rk.outcome = rk.ar.get(0)
        except Exception as exc:
            if outcomes.late_interrupt(exc):
                rk.outcome = CellOutcome("interrupted", time.time(), summary="nbdist: interrupted")
                return
            # the engine went away under the call
            rk.outcome = outcomes.lost("died", f"engine lost: {type(exc).__name__}: {exc}")
            # given up by the controller, a frozen process still holds its peers' links: killed,
            # they fail at once (not after grace and stop_wait)
            self.cluster.engines.signal([rk.pid], sig=9)

    def _running(self) -> list[RankRun]:
        return [rk for rk in self.ranks.values() if rk.outcome is None]

    def _note_exits(self, report: CellReport) -> None:
        exited = self.cluster.drain_exits()
        for rk in self.ranks.values():
            ex = exited.get(rk.pid)
            if ex is not None and rk.outcome is None:
                rk.outcome = outcomes.lost("died", f"engine process {ex.describe()} (pid {ex.pid})")

    def _stop_running(self, report: CellReport, why: str) -> None:
        """Show where the ranks still running are, interrupt them; kill those that won't stop."""
        running = self._running()
        if not running:
            return
        self._show_where(running, why)
        self.cluster.engines.signal([rk.pid for rk in running])
        deadline = time.monotonic() + self.opts.stop_wait
        while self._running() and time.monotonic() < deadline:
            self._poll_once(report)
            time.sleep(_POLL)
        for rk in self._running():
            self._kill(
                rk,
                f"did not stop within {self.opts.stop_wait:.0f} s of an interrupt; "
                "its engine was killed and replaced",
            )

    def _kill(self, rk: RankRun, why: str) -> None:
        """A hung rank: kill its engine (recovery replaces it) and say why."""
        self.cluster.engines.signal([rk.pid], sig=9)
        rk.outcome = outcomes.lost("hung", why)

    def _show_where(self, ranks: list[RankRun], why: str) -> None:
        """Print where each of ``ranks`` is now, folded (``debug.stacks``), before it is
        stopped: the one look there is at a rank stuck in a collective or in C code."""
        got = stacks.collect(self.cluster.engines, {rk.rank: (rk.pid, rk.ar) for rk in ranks})
        where = stacks.fold(got, self.program)
        print(f"{self.prefix}nbdist: {why}; where the ranks were:\n{where}", flush=True)

    def _note_hangs(self) -> None:
        """Ask the watch (its collector) which ranks passed the progress deadline; kill those,
        so the cell ends and recovery can replace them."""
        if self.watch is None:
            return
        hung = [self.ranks[r] for r in self.watch.hung_ranks(self.opts.progress_timeout)]
        hung = [rk for rk in hung if rk.outcome is None]
        if hung:
            deadline = f"no progress for {self.opts.progress_timeout:g} s"
            self._show_where(hung, f"{deadline}: killing the ranks that made none")
        for rk in hung:
            self._kill(
                rk,
                f"made no progress for {self.opts.progress_timeout:g} s "
                "(the progress deadline); its engine was killed",
            )

    @holding  # output and telemetry are never half read
    def _poll_once(self, report: CellReport) -> None:
        self._note_exits(report)
        self._note_hangs()
        for rk in self.ranks.values():
            if rk.outcome is None and rk.ar.ready():
                self._collect(rk)
            self._stream(rk)
        if self._in_order:
            self._in_order.flush()
        if self.watch is not None:
            self.watch.poll(self.ranks)

    def pause(self) -> None:
        """Wait for the next look: short while output flows, longer otherwise; a rank's reply
        (done, failed) ends the wait at once, so a failure is acted on without delay."""
        now = time.monotonic()
        if self._news:
            self._news, self._quiet_since = False, now
        busy = now - self._quiet_since < _ACTIVE_FOR
        self._wake.wait(_POLL if busy else _IDLE_POLL)
        self._wake.clear()

    def step(self) -> bool:
        """One look at the ranks, acting on a failure (after the grace), on the deadline and on
        an observer's request to stop; True once no rank runs. The run's controller steps it
        (a sweep steps many in turn), with ``pause`` between looks."""
        if not self._running():
            return True
        self._poll_once(self.report)
        now = time.monotonic()
        for r, rk in self.ranks.items():
            if rk.outcome and not rk.outcome.ok and r not in self.report.went_on:
                if self._first_failure is None and survivors.goes_on(r, self.ranks):
                    self.report.went_on[r] = survivors.tell(rk, self.prefix, self.watch)
                elif self._first_failure is None:
                    self._first_failure = now
        self._look_for_lone_waiters(now)
        stop = self.watch.stop if self.watch is not None else None
        if stop is not None and stop.reason is not None and self.report.stopped is None:
            self.report.stopped = stop
            self._stop_running(self.report, stop.note)
        elif self._first_failure is not None and now - self._first_failure > self.opts.grace:
            self._stop_running(self.report, "stopping the ranks a failure left running")
        elif self._deadline is not None and now > self._deadline:
            self._timed_out = True
            self._stop_running(self.report, f"the cell ran past --timeout {self.opts.timeout:g} s")
        return not self._running()

    def _look_for_lone_waiters(self, now: float) -> None:
        """A rank that ended its cell well while others run: are they waiting in a collective
        it will never join? Then the ranks ran different collectives (a loop that stops on the
        clock, uneven data): the ranks that ended leave their group, so the waiting ones fail
        at once, and the cell ends with one line that says so (``collisions``)."""
        ended = {r: rk for r, rk in self.ranks.items() if rk.outcome is not None and rk.outcome.ok}
        running = self._running()
        if not ended or not running or self._first_failure is not None or self._mismatch:
            self._ended_at = None
            return
        if self._ended_at is None:
            self._ended_at = now
        if now - self._ended_at < self._lone_look:
            return
        self._lone_look = min(2 * self._lone_look, _LONE_LOOK_MAX)
        got = stacks.collect(self.cluster.engines, {rk.rank: (rk.pid, rk.ar) for rk in running})
        health = self.watch.collector.ranks if self.watch is not None else {}
        waiting = collisions.waiting(got, {r: st.health for r, st in health.items()})
        if not waiting:
            return
        self._mismatch = collisions.failure(waiting, {r: rk.outcome for r, rk in ended.items()})
        print(f"{self.prefix}nbdist: {self._mismatch.summary}", flush=True)
        fanout.on_ranks(self.cluster, api.leave_group, ranks=sorted(ended), timeout=30)

    def interrupt(self) -> None:
        """Stop every rank still running: the interrupt button, or a sweep stopping a trial."""
        self.report.interrupted = True
        self._stop_running(self.report, "interrupted")

    def finish(self) -> CellReport:
        """Once no rank runs: the last output and reports, and how the cell went."""
        for rk in self.ranks.values():
            if rk.outcome is None:
                self._collect(rk)
            if self._may_trail(rk):
                rk.ar.wait_for_output(timeout=_OUTPUT_WAIT)  # iopub may trail the reply
            self._stream(rk, final=True)
        if self._in_order:
            self._in_order.flush(force=True)
        if self.watch is not None:  # the last reports, which may have trailed the reply too
            self.watch.poll(self.ranks)
        self.report.seconds = time.monotonic() - self._t0
        whole = len(self.ranks) == len(self.cluster.slots)
        deadline = self.opts.timeout if self._timed_out else None
        failed = outcomes.summarise(
            self.report, self.ranks, self.main_rank, whole, deadline, self._mismatch
        )
        self.cluster.note_cell({r: rk.outcome for r, rk in self.ranks.items()}, failed)
        gone = [rk.ar for rk in self.ranks.values() if rk.outcome.kind in ("died", "hung")]
        fanout.forget(self.cluster.client, gone)  # no reply will ever free their records
        return self.report

    def _may_trail(self, rk: RankRun) -> bool:
        """Whether output of ``rk`` that matters may still be on its way after its reply (it
        travels apart from the reply, a millisecond or more behind): its reports, for the
        observers; its output, if shown and it printed; a failure's, whatever it printed."""
        out = rk.outcome
        if out.kind in ("died", "hung"):  # no reply came: nothing more will
            return False
        watched = self.watch is not None
        return watched or not out.ok or (self._visible(rk.rank) and out.printed)

    def wait(self) -> CellReport:
        """Watch the cell to its end and say how it went (the interrupt button stops it)."""
        try:
            while not self.step():
                self.pause()
        except KeyboardInterrupt:
            self.interrupt()
        return self.finish()
