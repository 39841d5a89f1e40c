"""A cell whose ranks run different numbers of collectives ends within seconds, and says why.

A loop that stops on the clock, or on uneven data, runs one more step on one rank than on
another: the rank that ended leaves the others waiting in a collective it will never join.
The cell ends within seconds (not at its ``--timeout``, not never) with one line naming the
waiting rank, its collective and each rank's count, and what to do; the next cell trains.
"""

from __future__ import annotations

import contextlib
import time

import pytest
from clusters import cluster_with, watched

from nbdist.errors import DistributedCellError

PREPARE = """
import torch
torch.manual_seed(0)
net = torch.nn.Linear(8, 1)
model, opt = nbdist.prepare(net, torch.optim.SGD(net.parameters(), lr=0.01))
"""
#: each rank trains a different number of steps (the last batch of uneven shards)
UNEVEN = """
for _ in range(20 + nbdist.rank()):
    opt.zero_grad()
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
"""
EVEN = UNEVEN.replace("20 + nbdist.rank()", "3")


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("watch", [False, True], ids=["plain", "watched"])
def test_an_uneven_loop_ends_within_seconds_naming_the_waiting_rank(n, watch):
    with contextlib.closing(cluster_with(n)) as made:
        cluster = next(made)
        cluster.run(PREPARE)
        t0 = time.monotonic()
        with pytest.raises(DistributedCellError) as err:
            cluster.run(UNEVEN, watch=watched(cluster, UNEVEN) if watch else None)
        took = time.monotonic() - t0
        lines = [ln for ln in str(err.value).splitlines() if "waits in" in ln]
        assert len(lines) == 1, str(err.value)
        # rank 0 ended after 20 steps; rank 1 (the first of those left) waits in the 21st
        # step's all-reduce: the line names it, its collective, and what to do
        assert "rank 1 waits in all_reduce" in lines[0], lines[0]
        if watch:  # its count comes with its reports (read from outside, the stack has none)
            assert "its collective #21 of this cell" in lines[0], lines[0]
        assert "(rank 0 after 20 collectives)" in lines[0], lines[0]
        assert "different numbers of collectives" in lines[0] and "Join" in lines[0]
        assert took < 10, f"the uneven cell took {took:.1f} s to end"
        cluster.run(EVEN)  # the next cell trains the same model on every rank
