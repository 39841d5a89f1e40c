"""A rank interrupted part-way through a shared-memory all-reduce (``nbdist.worker.collectives``)
never leaves its peers summing stale slots: two ranks forked from one process on one real
segment, a real SIGINT delivered to rank 1 right after its copy in a round, the person's code
catching it and calling again. Every later call fails on both ranks, naming the stop or the
ranks out of step, within seconds; no call returns a wrong sum."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from nbdist.worker.collectives import shared_memory

pytestmark = pytest.mark.skipif(not shared_memory.supported(), reason="x86-64 Linux only")

#: argv: the round (counted from the interrupted call's start) whose copy rank 1 is interrupted
#: after, and whether a second SIGINT reaches it as it starts to stop the group (an interrupt
#: pressed twice, or a stop's signal after a peer's). Prints one JSON line per rank.
_RANKS = r"""
import ctypes, json, os, signal, sys
import torch
from nbdist.worker.collectives import group, shared_memory
from nbdist.worker.collectives.shared_memory import Exchange

SLOT, N, CALLS, INTERRUPTED = 4096, 2500, 5, 1  # 1024 floats a round: a call is 3 rounds
at_round, twice = int(sys.argv[1]), sys.argv[2] == "twice"
fd, path = group._make(shared_memory.segment_bytes(2, SLOT))
os.unlink(path)
parent = os.getpid()
child = os.fork()
rank = 1 if child == 0 else 0
if rank == 1:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: never outlive the test
ex = Exchange(fd, rank, 2, SLOT, [parent, child or os.getpid()], timeout=20.0)
os.close(fd)

def value(r, call):
    return torch.arange(N, dtype=torch.float32) % 7 + 10.0 * (call + 1) * (r + 2)

if rank == 1:
    arrive, abort, seen, fired = ex._arrive, ex.abort, [], []

    def interrupted_arrive():  # each round copies, then arrives: the signal lands in between
        seen.append(1)
        if calls_done == INTERRUPTED and len(seen) == 2 * at_round + 1:
            os.kill(os.getpid(), signal.SIGINT)
        arrive()

    def interrupted_abort(why):
        if twice and not fired:
            fired.append(1)
            os.kill(os.getpid(), signal.SIGINT)
        abort(why)

    ex._arrive, ex.abort = interrupted_arrive, interrupted_abort

out = []
for calls_done in range(CALLS):
    seen = [] if rank == 1 else None
    t = value(rank, calls_done)
    try:
        ex.allreduce(t, torch.add)
    except KeyboardInterrupt:  # the person's code (or a framework) carries on
        out.append("KeyboardInterrupt")
        continue
    except Exception as e:
        out.append(f"{type(e).__name__}: {e}")
        continue
    out.append("right" if torch.equal(t, value(0, calls_done) + value(1, calls_done)) else
               f"wrong sum: {t[:3].tolist()}")
os.write(1, json.dumps({"rank": rank, "calls": out}).encode() + b"\n")  # one write: whole
if rank == 1:
    os._exit(0)
os.waitpid(child, 0)
"""


def _run(at_round: int, twice: bool) -> dict[int, list[str]]:
    t0 = time.monotonic()
    args = [sys.executable, "-c", _RANKS, str(at_round), "twice" if twice else "once"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert time.monotonic() - t0 < 60, "the ranks waited for each other: they should not"
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    return {line["rank"]: line["calls"] for line in lines}


@pytest.mark.parametrize("at_round", [0, 1, 2])
@pytest.mark.parametrize(
    ("twice", "named"),
    # once: the rank stops the group as it leaves the call. Twice: the second interrupt lands
    # as it starts to stop the group, the stop is never written, and only the call number its
    # next call publishes at the barrier tells its peer
    [(False, "KeyboardInterrupt on rank 1"), (True, "ranks out of step")],
    ids=["stopped", "stop-cut-short"],
)
def test_a_rank_interrupted_after_a_copy_fails_every_later_call_on_both_ranks(
    at_round, twice, named
):
    got = _run(at_round, twice)
    assert got[0][0] == got[1][0] == "right"
    assert got[1][1] == "KeyboardInterrupt"
    for rank, calls in got.items():
        assert not [c for c in calls if c.startswith("wrong")], (rank, calls)
        assert len(calls) == 5
        for c in calls[1 + rank :]:  # rank 0's interrupted call too
            assert c.startswith("Aborted: all-reduce through shared memory stopped: "), (rank, c)
            assert named in c, (rank, c)
