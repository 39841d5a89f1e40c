"""What to do when a ``%%distributed`` cell fails: a pure decision (``controller`` carries it out).

The decision is a function of the run's counters and the failure, and nothing else, so it is
tested on its own (``tests/unit/test_recovery_policy.py``)::

    decide(state, failure) -> (decision, new state)

    failure          restarts left   replaceable   >= min workers   decision
    none             -               -             -                FINISH
    interrupted      -               -             -                RAISE     (the person asked)
    app error        -               -             -                RAISE     (it would fail again)
    worker lost      0               -             -                RAISE     (budget spent)
    worker lost      > 0             yes           -                RESTART   (same size)
    worker lost      > 0             no            yes              SHRINK    (fewer ranks)
    worker lost      > 0             no            no               RAISE
    storage          0               -             -                RAISE     (budget spent)
    storage          > 0             yes           -                RESTART   (no rank lost)
    storage          > 0             no            yes              SHRINK    (to the same size)

A worker is lost when its engine died, hung past the progress deadline, or had to be killed.
A cell stopped by ``--timeout`` is an app error, even when a rank that would not stop had to be
killed on the way: the person's own deadline passed, and a retry would pass it again. Storage is
a checkpoint that could not be written (disk full): retried, as the storage may recover.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace


class Failure(enum.Enum):
    NONE = "none"
    INTERRUPTED = "interrupted"
    APP_ERROR = "app error"
    WORKER_LOST = "worker lost"
    STORAGE = "storage"

    @property
    def retryable(self) -> bool:
        """True when ``--restarts`` may run the cell again."""
        return self in (Failure.WORKER_LOST, Failure.STORAGE)


class Decision(enum.Enum):
    FINISH = "finish"
    RAISE = "raise"
    RESTART = "restart"
    SHRINK = "shrink"


@dataclass(frozen=True)
class RunState:
    """The counters the policy reads: budget, size, and whether lost workers can be replaced."""

    restarts_left: int
    world_size: int
    min_workers: int
    lost: int = 0  # workers lost in this failure
    replaceable: bool = True
    restarts_done: int = 0


def classify(interrupted: bool, failure_kinds: list[str]) -> Failure:
    """The failure of a cell from its ranks' failure kinds (see ``supervisor``; ``storage``
    comes from the engine, ``runner._failure``), the first that applies in the table's order."""
    kinds = set(failure_kinds)
    if interrupted:
        return Failure.INTERRUPTED
    if "timeout" in kinds:  # a rank killed for not stopping at the deadline is no lost worker
        return Failure.APP_ERROR
    if kinds & {"died", "hung", "silent"}:
        return Failure.WORKER_LOST
    if "storage" in kinds:
        return Failure.STORAGE
    if kinds:
        return Failure.APP_ERROR
    return Failure.NONE


def decide(state: RunState, failure: Failure) -> tuple[Decision, RunState]:
    """The policy: what to do about ``failure``, and the counters afterwards."""
    if failure is Failure.NONE:
        return Decision.FINISH, state
    if not failure.retryable or state.restarts_left <= 0:
        return Decision.RAISE, state
    spent = replace(
        state, restarts_left=state.restarts_left - 1, restarts_done=state.restarts_done + 1
    )
    if state.replaceable:
        return Decision.RESTART, spent
    if state.world_size - state.lost >= max(1, state.min_workers):
        return Decision.SHRINK, replace(spent, world_size=state.world_size - state.lost)
    return Decision.RAISE, state
