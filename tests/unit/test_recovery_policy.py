"""The failure policy is a pure function: its whole table; the run controller's transitions."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nbdist.errors import DistributedCellError, NbdistError, RankFailure
from nbdist.notebook.cluster.journal import Journal
from nbdist.notebook.run.controller import TRANSITIONS, RunController
from nbdist.notebook.run.formation import World
from nbdist.notebook.run.observers.base import Phase
from nbdist.notebook.run.outcomes import CellReport
from nbdist.notebook.run.recovery import Decision, Failure, RunState, classify, decide


@pytest.mark.parametrize(
    "failure, restarts, replaceable, world, lost, min_workers, expected",
    [
        (Failure.NONE, 0, True, 2, 0, 2, Decision.FINISH),
        (Failure.INTERRUPTED, 3, True, 2, 0, 2, Decision.RAISE),
        (Failure.APP_ERROR, 3, True, 2, 0, 2, Decision.RAISE),
        (Failure.WORKER_LOST, 0, True, 2, 1, 2, Decision.RAISE),
        (Failure.WORKER_LOST, 1, True, 2, 1, 2, Decision.RESTART),
        (Failure.WORKER_LOST, 1, False, 4, 1, 3, Decision.SHRINK),
        (Failure.WORKER_LOST, 1, False, 4, 2, 3, Decision.RAISE),
        (Failure.WORKER_LOST, 1, False, 2, 1, 2, Decision.RAISE),
    ],
)
def test_policy_table(failure, restarts, replaceable, world, lost, min_workers, expected):
    state = RunState(restarts, world, min_workers, lost=lost, replaceable=replaceable)
    decision, after = decide(state, failure)
    assert decision is expected
    if decision in (Decision.RESTART, Decision.SHRINK):
        assert after.restarts_left == restarts - 1 and after.restarts_done == 1
    else:
        assert after == state  # nothing spent
    if decision is Decision.SHRINK:
        assert after.world_size == world - lost


def test_budget_runs_out():
    state = RunState(restarts_left=2, world_size=2, min_workers=2, lost=1)
    decisions = []
    for _ in range(3):
        d, state = decide(state, Failure.WORKER_LOST)
        decisions.append(d)
    assert decisions == [Decision.RESTART, Decision.RESTART, Decision.RAISE]


def test_classify():
    assert classify(False, []) is Failure.NONE
    assert classify(True, ["died"]) is Failure.INTERRUPTED
    assert classify(False, ["error", "interrupted"]) is Failure.APP_ERROR
    assert classify(False, ["died", "interrupted"]) is Failure.WORKER_LOST
    assert classify(False, ["hung"]) is Failure.WORKER_LOST
    assert classify(False, ["timeout", "timeout"]) is Failure.APP_ERROR


def test_lifecycle_transitions():
    terminal = {p for p, nxt in TRANSITIONS.items() if not nxt}
    assert terminal == {p for p in Phase if p.terminal}
    assert terminal == {Phase.FINISHED, Phase.FAILED, Phase.INTERRUPTED}
    assert set(TRANSITIONS) == set(Phase)
    # every phase can reach an end
    for phase in TRANSITIONS:
        seen, todo = set(), [phase]
        while todo:
            p = todo.pop()
            seen.add(p)
            todo += [n for n in TRANSITIONS[p] if n not in seen]
        assert seen & terminal, phase
    assert Phase.RECOVERING in TRANSITIONS[Phase.RUNNING]
    assert Phase.RUNNING in TRANSITIONS[Phase.RECOVERING]
    assert Phase.FINISHED not in TRANSITIONS[Phase.RECOVERING]  # recovery always runs again


class _ScriptedJournal(Journal):
    """A journal holding one step, which says so when recovery replays it."""

    def __init__(self, calls):
        super().__init__()
        self.calls = calls
        self.record(lambda: calls.append("replay"))

    def add_cell(self, *args):
        self.calls.append("journal")


class _ScriptedCluster:
    """The controller's view of a cluster's ranks; its attempts (``run_once``, the controller's
    ``attempt``) answered from a script of reports. (The same controller drives real clusters
    in test_recovery.py; this checks its steps.)"""

    def __init__(self, reports, replaceable=True):
        self.reports = list(reports)
        self.slots = [SimpleNamespace(rank=0), SimpleNamespace(rank=1)]
        self.replaceable = replaceable
        self.calls = []
        self.group_ready = True
        self.journal = _ScriptedJournal(self.calls)

    def run_once(self, *args):
        self.calls.append("run")
        return self.reports.pop(0)

    def group_of(self, ranks=None):
        return {}

    def note_group(self, stands):
        self.group_ready = stands

    def replace(self, lost):
        self.calls.append(("replace", lost))
        if not self.replaceable:
            raise NbdistError("no engine")

    def shrink(self, lost):
        self.calls.append(("shrink", lost))
        self.slots = self.slots[: len(self.slots) - len(lost)]

    def repair(self, lost, group_broken, full):
        return ""


class _Watcher:
    """What the controller tells a run's watch, kept."""

    def __init__(self):
        self.phases, self.events, self.closed = [], [], None

    def on_phase(self, old, new):
        self.phases.append((old.value, new.value))

    def on_event(self, kind, rank, message, data):
        self.events.append((kind, rank))

    def close(self, status, failures=(), recorded=True):
        self.closed = status


class _Done:
    """An attempt that has already ended with ``report`` (the supervisor's ``CellRun``)."""

    def __init__(self, report):
        self.report = report

    def step(self):
        return True

    def finish(self):
        return self.report

    def pause(self):
        pass


def _lost_report(rank):
    failure = RankFailure(rank, "engine process killed by SIGKILL", "", 0.0, "died")
    return CellReport(failures=[failure], lost=[rank], group_broken=True)


def _controller(cluster, restarts=1, min_workers=None):
    from nbdist.config import CellOptions
    from nbdist.protocol import Program

    watcher = _Watcher()
    opts = CellOptions(restarts=restarts, min_workers=min_workers)
    cell = Program(source="pass", filename="<t>", argv=("<t>",))
    ctl = RunController(
        cluster,
        cell,
        opts,
        World(
            cluster,
            opts,
            restore=lambda cluster, lost, again=False: [e() for e in cluster.journal] and "",
        ),
        run_key="k",
        watch=watcher,
        start=lambda cluster, launch: _Done(cluster.run_once(launch)),
    )
    return ctl, watcher


def test_controller_restarts_a_lost_worker_and_tells_observers():
    cluster = _ScriptedCluster([_lost_report(1), CellReport(value=42)])
    ctl, watcher = _controller(cluster)
    assert ctl.run() == 42
    assert cluster.calls == ["run", ("replace", [1]), "replay", "run", "journal"]
    assert watcher.phases == [
        ("starting", "running"),
        ("running", "recovering"),
        ("recovering", "running"),
        ("running", "finished"),
    ]
    assert watcher.events == [("failure", 1), ("restart", None)]


def test_controller_shrinks_when_no_engine_can_replace():
    cluster = _ScriptedCluster([_lost_report(1), CellReport(value=1)], replaceable=False)
    ctl, watcher = _controller(cluster, min_workers=1)
    assert ctl.run() == 1
    assert cluster.calls == ["run", ("replace", [1]), ("shrink", [1]), "replay", "run", "journal"]


def test_controller_fails_in_one_error_when_recovery_cannot_happen():
    cluster = _ScriptedCluster([_lost_report(0)], replaceable=False)
    ctl, watcher = _controller(cluster)
    with pytest.raises(DistributedCellError, match="rank 0: engine process killed") as err:
        ctl.run()
    assert "nbdist: no replacement engine: no engine" in err.value.report()
    assert watcher.phases[-1] == ("recovering", "failed")
    with pytest.raises(RuntimeError, match="cannot go from"):
        ctl._enter(Phase.RUNNING)


# -- the table in recovery's docstring is the policy: every row, checked against decide() -------


def _table_rows() -> list[tuple]:
    """(failure, restarts left, replaceable, >= min workers, decision) for each row."""
    import re

    import nbdist.notebook.run.recovery as recovery

    rows = []
    for line in recovery.__doc__.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) >= 5 and cells[4] in Decision.__members__:
            rows.append((Failure(cells[0]), *cells[1:5]))
    return rows


def test_the_docstring_table_lists_every_failure():
    assert {row[0] for row in _table_rows()} == set(Failure)
    assert len(_table_rows()) == 10


@pytest.mark.parametrize("row", _table_rows(), ids=lambda r: " ".join(map(str, r)))
def test_each_row_of_the_docstring_table_is_what_decide_does(row):
    failure, restarts, replaceable, enough, expected = row
    left = {"-": 1, "0": 0, "> 0": 1}[restarts]
    lost = 0 if failure is Failure.STORAGE else 1  # a storage failure loses no rank
    state = RunState(
        restarts_left=left,
        world_size=4,
        min_workers=3 if enough != "no" else 4,
        lost=lost,
        replaceable=replaceable != "no",
    )
    decision, after = decide(state, failure)
    assert decision is Decision[expected]
    spent = decision in (Decision.RESTART, Decision.SHRINK)
    assert after.restarts_left == left - spent


def test_a_timed_out_cell_is_not_retried_even_when_a_rank_was_killed_on_the_way():
    # --timeout interrupts every rank; one that does not stop within stop_wait is killed as
    # "hung" by the supervisor: the cell still ended by the person's deadline, not a lost worker
    for kinds in (["timeout", "hung"], ["hung", "timeout"], ["timeout", "died"], ["timeout"]):
        failure = classify(False, kinds)
        assert failure is Failure.APP_ERROR, kinds
        decision, after = decide(RunState(restarts_left=3, world_size=2, min_workers=2), failure)
        assert decision is Decision.RAISE and after.restarts_left == 3


def test_a_rank_hung_past_the_progress_deadline_stays_retryable():
    assert classify(False, ["hung", "error"]) is Failure.WORKER_LOST
    state = RunState(restarts_left=1, world_size=2, min_workers=2, lost=1)
    assert decide(state, Failure.WORKER_LOST)[0] is Decision.RESTART


def test_a_checkpoint_that_could_not_be_written_is_retried_on_the_same_engines():
    assert classify(False, ["storage", "error"]) is Failure.STORAGE  # rank 1 a bystander
    assert classify(False, ["storage", "died"]) is Failure.WORKER_LOST  # a lost worker wins
    assert classify(True, ["storage"]) is Failure.INTERRUPTED
    assert Failure.STORAGE.retryable and Failure.WORKER_LOST.retryable
    assert not Failure.APP_ERROR.retryable and not Failure.INTERRUPTED.retryable
    state = RunState(restarts_left=1, world_size=2, min_workers=2)
    decision, after = decide(state, Failure.STORAGE)
    assert decision is Decision.RESTART and after.restarts_left == 0 and after.restarts_done == 1
    assert after.world_size == 2  # nobody was lost
    assert decide(after, Failure.STORAGE) == (Decision.RAISE, after)  # the budget is spent


def test_controller_retries_a_storage_failure_without_losing_a_rank():
    failure = RankFailure(0, "CheckpointWriteError: could not write", "", 0.0, "storage")
    bystander = RankFailure(1, "RuntimeError: Connection closed by peer", "", 0.1, "error")
    report = CellReport(failures=[failure, bystander], group_broken=True)
    groups = []

    class _Cluster(_ScriptedCluster):
        def run_once(self, *args):
            groups.append(self.group_ready)
            return super().run_once(*args)

    cluster = _Cluster([report, CellReport(value=7)])
    ctl, watcher = _controller(cluster)
    assert ctl.run() == 7
    # every engine lives: nothing replaced, nothing replayed, the same ranks on a fresh group
    assert cluster.calls == ["run", "run", "journal"]
    assert groups == [True, False]
    assert watcher.events == [("failure", 0), ("restart", None)]
