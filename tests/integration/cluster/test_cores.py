"""An engine fitted to its host: each CPU rank on its own share of the cores
(``nbdist.worker.host``), as taskset would place it, every thread of the engine included; its C
heap kept from one step to the next and handed back when a cell ends (``nbdist.worker.host``);
its start-up objects out of the cyclic collector's walks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nbdist.worker.host import share


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


#: Two steps' worth of allocations: 300 tensors of 1 MiB, written, freed, then again. glibc,
#: untuned, hands the freed top of its heap back to the OS at once (it is far beyond its trim
#: threshold) and faults its 76,800 pages in again for the second; tuned, it keeps them.
_STEPS = """
import os, time, torch
def _faults():
    return int(open('/proc/self/stat').read().rsplit(')', 1)[1].split()[7])
def _rss():
    return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE') >> 20
_t0 = time.monotonic()
xs = [torch.ones(1 << 18) for _ in range(300)]
_peak = _rss()
del xs
_kept = _rss()
_f = _faults()
xs = [torch.ones(1 << 18) for _ in range(300)]
_again = _faults() - _f
del xs
while time.monotonic() - _t0 < 0.6:  # a cell long enough for its end to hand memory back
    sum(range(1000))
(_peak, _kept, _again)
"""


def test_a_step_reuses_the_memory_the_last_one_freed_and_the_cell_hands_it_back(cluster):
    plain = subprocess.run(
        [sys.executable, "-c", _STEPS.replace("(_peak, _kept, _again)", "print(_kept, _again)")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    plain_kept, plain_again = map(int, plain.stdout.split())
    if plain_again < 76_800 / 2:
        pytest.skip(f"this C library keeps freed memory untuned too ({plain_kept} MiB kept)")
    peak, kept, again = cluster.run(_STEPS, _ranks(0))
    after = cluster.run("_rss()", _ranks(0))  # the engine kept the cell's names
    assert kept > peak - 50, f"the engine gave back freed memory mid-cell: {peak} -> {kept} MiB"
    assert again < 76_800 / 10, f"{again} page faults for the second step ({plain_again} untuned)"
    assert after < peak - 200, f"the engine holds {after} MiB after its cell (peak {peak} MiB)"


def test_the_engines_own_objects_are_out_of_the_collectors_walks(cluster):
    assert cluster.run("import gc\ngc.get_freeze_count()", _ranks(0)) > 10_000
