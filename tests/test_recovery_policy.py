"""The failure policy is a pure function: its whole table, and the run lifecycle's transitions."""

from __future__ import annotations

import pytest

from nbdist.notebook.recovery import (
    TRANSITIONS,
    Decision,
    Failure,
    RunState,
    classify,
    decide,
)


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
    terminal = {s for s, nxt in TRANSITIONS.items() if not nxt}
    assert terminal == {"finished", "failed", "interrupted"}
    assert all(nxt <= set(TRANSITIONS) for nxt in TRANSITIONS.values())
    # every state can reach an end
    for state in TRANSITIONS:
        seen, todo = set(), [state]
        while todo:
            s = todo.pop()
            seen.add(s)
            todo += [n for n in TRANSITIONS[s] if n not in seen]
        assert seen & terminal, state
    assert "recovering" in TRANSITIONS["running"] and "running" in TRANSITIONS["recovering"]


def test_lifecycle_follows_the_table_and_tells_observers():
    from nbdist.notebook.recovery import Lifecycle

    seen = []

    class Watcher:
        def state(self, old, new):
            seen.append((old, new))

    life = Lifecycle([Watcher(), object()])
    for s in ("running", "recovering", "running", "finished"):
        life.to(s)
    assert seen == [
        ("starting", "running"),
        ("running", "recovering"),
        ("recovering", "running"),
        ("running", "finished"),
    ]
    with pytest.raises(RuntimeError, match="cannot go from finished to running"):
        life.to("running")
