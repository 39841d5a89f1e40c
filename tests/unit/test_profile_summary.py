"""``--profile``'s summary read from the ranks' results: each rank's step mostly computing, in
collectives or waiting for data, and the straggler a rank starved by its input."""

from __future__ import annotations

import pytest

from nbdist.notebook.debug.profile import ProfileRow, read
from nbdist.protocol import ProfileResult


def test_a_rank_starved_by_its_input_is_the_straggler_waiting_for_data():
    """Rank 1 waits 80 ms per step for its batches; rank 0, with its data at hand, waits as long
    in each step's all-reduce for rank 1."""
    profiled = read(
        {
            0: ProfileResult(steps=10, seconds=1.0, data=0.0, collectives=(0.0805,) * 10),
            1: ProfileResult(steps=10, seconds=1.0, data=0.8, collectives=(0.0005,) * 10),
        }
    )
    fast, slow = profiled.table
    assert (fast.wait_ms, fast.data_ms, slow.wait_ms, slow.data_ms) == pytest.approx(
        (80.0, 0.0, 0.0, 80.0)
    )
    assert [r.mostly for r in profiled.table] == ["in collectives", "waiting for data"]
    assert profiled.straggler == 1
    assert profiled.reason == (
        "straggler: rank 1, waiting for data 80.0 ms per step against 0.0 on the others "
        "(rank 0 wait 80.0 ms per step for it)"
    )
    text = profiled.text().splitlines()
    assert "waiting for data" in text[0] and text[0].split()[-4:] == [
        "mostly",
        "(ms",
        "per",
        "step)",
    ]
    assert text[1].endswith("in collectives") and text[2].endswith("waiting for data")
    assert [r["mostly"] for r in profiled.shown()["rows"]] == ["in collectives", "waiting for data"]


def test_a_rank_that_computes_more_is_the_straggler_computing():
    profiled = read(
        {
            0: ProfileResult(steps=10, seconds=1.0, data=0.01, collectives=(0.06,) * 10),
            1: ProfileResult(steps=10, seconds=1.0, data=0.01, collectives=(0.001,) * 10),
        }
    )
    assert [r.mostly for r in profiled.table] == ["in collectives", "computing"]
    assert profiled.reason.startswith("straggler: rank 1, computing 99.0 ms per step against 40.0")


def test_mostly_is_the_largest_of_the_three():
    def row(compute: float, comm: float, wait: float, data: float) -> ProfileRow:
        return ProfileRow(0, 1, compute + wait + data, compute, comm, data, wait)

    assert row(10, 1, 2, 3).mostly == "computing"
    assert row(1, 4, 4, 7).mostly == "in collectives"  # communicating and waiting for others
    assert row(1, 1, 1, 7).mostly == "waiting for data"
