"""One rule for "the cause" of a failed run, whichever way its failures arrived: the cell's
error, the board's end line (``RunEnd.message``), the run store's ``error`` (the sidebar's) and
``%nbdist debug``'s default rank name the same ranks."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

from nbdist.errors import DistributedCellError, RankFailure, cause, rank_list
from nbdist.notebook.debug.postmortem import pick
from nbdist.notebook.run.observers.base import RunEnd
from nbdist.telemetry.rows import error_line


def _alike(n: int = 4) -> list[RankFailure]:
    # Every rank failed alike, each a little later than the one before it arrived: the arrival
    # order is what changed from one run to the next.
    return [
        RankFailure(
            r, "ValueError: bad shape", f"  File cell, line 3, rank {r}\n", at=10.0 + r * 0.01
        )
        for r in range(n)
    ]


def _seen_everywhere(failures: list[RankFailure]) -> set[str]:
    cell = str(DistributedCellError(failures))
    end = RunEnd("failed", 12.0, SimpleNamespace(started=10.0), tuple(failures)).message()
    stored = error_line(
        [{"rank": f.rank, "summary": f.summary, "kind": f.kind, "at": f.at} for f in failures]
    )
    return {cell, end.split(": ", 1)[1], stored}


def test_every_arrival_order_names_the_same_ranks_everywhere():
    for order in itertools.permutations(_alike()):
        assert _seen_everywhere(list(order)) == {"ranks 0-3: ValueError: bad shape"}


def test_the_first_to_fail_by_itself_is_the_cause_and_bystanders_never_are():
    failures = [
        RankFailure(0, "RuntimeError: Connection closed by peer", at=1.0),
        RankFailure(3, "KeyError: 'b'", at=2.0),
        RankFailure(1, "ZeroDivisionError: division by zero", at=3.0),
    ]
    for order in itertools.permutations(failures):
        assert _seen_everywhere(list(order)) == {"rank 3: KeyError: 'b'"}
    only_bystanders = [RankFailure(1, "nbdist: interrupted", kind="interrupted")]
    assert cause(only_bystanders) is None
    assert error_line([{"rank": 1, "summary": "nbdist: interrupted", "kind": "interrupted"}]) == ""


def test_the_debugger_opens_the_causes_lowest_rank():
    failures = list(reversed(_alike(3)))
    slots = [SimpleNamespace(pid=100 + r) for r in range(3)]
    cluster = SimpleNamespace(failed={f.rank: (f, 100 + f.rank) for f in failures}, slots=slots)
    rank, failure = pick(cluster, None)
    assert rank == 0 and failure.rank == 0


def test_rank_lists_stay_short_at_any_number_of_ranks():
    assert rank_list([2]) == "rank 2"
    assert rank_list([2, 0]) == "ranks 0, 2"
    assert rank_list(range(256)) == "ranks 0-255"
    assert rank_list([0, 1, 2, 5, 6, 9, 10, 11, 12]) == "ranks 0-2, 5, 6, 9-12"


def test_stores_written_before_failures_had_times_still_name_a_cause():
    old = [{"rank": 2, "summary": "KeyError: 'b'", "kind": "error"}]
    assert error_line(old) == "rank 2: KeyError: 'b'"
    assert error_line([{"rank": "x"}]) == ""
