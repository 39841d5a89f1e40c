"""Each CPU rank on its own share of its host's cores (``nbdist.worker.cores``), as taskset
would place it: every thread of the engine, those started later included."""

from __future__ import annotations

import os

import pytest

from nbdist.worker.cores import share


def test_the_shares_are_contiguous_equal_and_apart_only_when_the_ranks_fit():
    assert [share(r, 2, (0, 1)) for r in range(2)] == [(0,), (1,)]
    assert [share(r, 2, (0, 1, 2, 3)) for r in range(2)] == [(0, 1), (2, 3)]
    assert [share(r, 3, (4, 5, 6, 7)) for r in range(3)] == [(4,), (5,), (6,)]
    assert share(2, 3, (0, 1)) == (0, 1)  # more ranks than cores: left to the OS
    assert share(5, 2, (0, 1)) == (0, 1)  # not a local rank of this host


_AFFINITIES = """
import os, threading, torch
threading.Thread(target=lambda: None).start()  # a thread started after the formation
torch.ones(256, 256) @ torch.ones(256, 256)  # torch's pool threads, started at first use
def _on(t):
    try:
        return tuple(sorted(os.sched_getaffinity(int(t))))
    except ProcessLookupError:  # a thread that ended since the listing (the one above)
        return None
sorted({a for a in map(_on, os.listdir('/proc/self/task')) if a is not None})
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: nothing to share")
def test_each_rank_and_every_thread_it_starts_stay_on_its_share(cluster):
    allowed = tuple(sorted(os.sched_getaffinity(0)))
    per_rank = {}
    for r in range(2):
        got = cluster.run(_AFFINITIES, _ranks(r))
        assert got == [share(r, 2, allowed)], f"rank {r}'s threads are on {got}"
        per_rank[r] = set(got[0])
    assert not per_rank[0] & per_rank[1]


def _ranks(r: int):
    from nbdist.config import CellOptions

    return CellOptions(ranks=(r,))
