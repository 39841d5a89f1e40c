"""DDP on CPU all-reduces through shared memory when its ranks share a host
(``nbdist.worker.collectives``), on real engines: bit for bit what gloo gives at 2 ranks, the
rank-order sum at 3, nothing left in /dev/shm, and a rank that fails or dies stops the ranks
waiting for it at once, named as the cause. ``--no-shm`` leaves DDP on gloo. The protocol
itself, rank by rank: ``tests/unit/test_shm_protocol.py``."""

from __future__ import annotations

import time

import pytest
from processes import assert_gone

import nbdist
from nbdist.errors import DistributedCellError
from nbdist.worker.collectives import shared_memory

pytestmark = pytest.mark.skipif(not shared_memory.supported(), reason="x86-64 Linux only")

_TRAIN = """
import glob, torch, torch.distributed as dist, torch.nn as nn, torch.nn.functional as F
def _train(group):
    torch.manual_seed(0)
    net = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(64, 1200), nn.ReLU(), nn.Linear(1200, 1200), nn.Linear(1200, 10)),
        process_group=group,
        bucket_cap_mb=2,  # the 1200 x 1200 weight is a bucket of its own: 5.8 MB, two rounds
    )
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(nbdist.rank())
    for _ in range(4):
        x, y = torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
    return net
"""

_BOTH_WAYS = (
    _TRAIN
    + """
before = sorted(glob.glob('/dev/shm/nbdist-shm-*'))
fast, plain = _train(None), _train(dist.group.WORLD)
same = all(torch.equal(a, b) for a, b in zip(fast.parameters(), plain.parameters()))
ops = []
for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int32):
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT, dist.ReduceOp.BAND):
        if op == dist.ReduceOp.BAND and dtype.is_floating_point:
            continue
        t = (torch.randn(3000, generator=torch.Generator().manual_seed(nbdist.rank())) * 9)
        t = t.to(dtype)
        a, b = t.clone(), t.clone()
        dist.all_reduce(a, op=op)
        dist.all_reduce(b, op=op, group=fast.process_group)
        ops.append(torch.equal(a, b))
seen = (dist.get_backend(fast.process_group), dist.get_backend(plain.process_group),
        dist.get_backend(), fast.process_group.exchange._seq > 0, same, all(ops),
        sorted(glob.glob('/dev/shm/nbdist-shm-*')) == before)
"""
)


_DIES = (
    _TRAIN
    + """
import os
net = _train(None)
ref = [torch.randn(50_000, generator=torch.Generator().manual_seed(r)) for r in range(3)]
got = ref[nbdist.rank()].clone()
dist.all_reduce(got, group=net.process_group)
in_order = torch.equal(got, (ref[0] + ref[1]) + ref[2])
if nbdist.rank() == 2:
    os._exit(3)
net(torch.ones(2, 64)).sum().backward()
"""
)


def test_three_ranks_sum_in_rank_order_and_a_rank_that_dies_fails_the_others_at_once():
    c = nbdist.start(n=3)
    pids = [p.pid for p in c.engines.processes()]
    try:
        t0 = time.monotonic()
        with pytest.raises(DistributedCellError) as info:
            c.run(_DIES)
        assert time.monotonic() - t0 < 60
        by_rank = {f.rank: f for f in info.value.failures}
        assert by_rank[2].kind == "died" and info.value.root_ranks == [2]
        for r in (0, 1):
            assert by_rank[r].bystander, by_rank[r]
            assert "all-reduce through shared memory stopped" in by_rank[r].summary
        assert c.pull("in_order", 0) and c.pull("in_order", 1)
    finally:
        c.stop()
    assert_gone(pids)


def test_no_shm_leaves_ddp_on_gloo():
    c = nbdist.start(n=2, shared_memory=False)
    pids = [p.pid for p in c.engines.processes()]
    try:
        c.run(_TRAIN + "seen = dist.get_backend(_train(None).process_group)")
        assert [c.pull("seen", r) for r in (0, 1)] == ["gloo", "gloo"]
    finally:
        c.stop()
    assert_gone(pids)


# the module's shared cluster, made at first use: after the tests that start their own
def test_ddp_gets_shared_memory_and_the_same_bits_as_gloo(cluster):
    cluster.run(_BOTH_WAYS)
    for rank in (0, 1):
        fast, plain, default, used, same, ops, no_file = cluster.pull("seen", rank)
        assert (fast, plain, default) == ("nbdist_shm", "gloo", "gloo"), rank
        assert used, f"rank {rank}: DDP never went through shared memory"
        assert same, f"rank {rank}: weights differ from gloo's after the same steps"
        assert ops, f"rank {rank}: an all-reduce differs from gloo's"
        assert no_file, f"rank {rank}: a segment file was left in /dev/shm"


def test_a_rank_that_fails_stops_the_rank_waiting_for_it_and_is_named_first(cluster):
    code = _TRAIN + (
        "net = _train(None)\n"
        "if nbdist.rank() == 1:\n"
        "    raise ValueError('rank 1 went wrong by itself')\n"
        "net(torch.ones(2, 64)).sum().backward()\n"  # rank 0 waits in the all-reduce
    )
    t0 = time.monotonic()
    with pytest.raises(DistributedCellError) as info:
        cluster.run(code)
    assert time.monotonic() - t0 < 60  # the collective timeout is 300 s
    (cause, first), (bystanders, then) = info.value.groups
    assert cause == [1] and "rank 1 went wrong by itself" in first.summary
    assert bystanders == [0] and then.bystander
    assert "all-reduce through shared memory stopped: rank 1 left the group" in then.summary
    # the next cell forms the group again, and its models a shared-memory group of their own
    again = cluster.run(_TRAIN + "n = _train(None)\n(dist.get_backend(n.process_group), "
                        "n.process_group.exchange is not None)")  # fmt: skip
    assert again == ("nbdist_shm", True)


def test_operations_gloo_does_for_the_group_never_deadlock(cluster):
    """A broadcast, all-gather or barrier through the shared-memory group is gloo's: called so
    that the interpreter's lock is let go while gloo's queue is waited on (torch's own C++
    call held it, and gloo's worker thread, freeing the last operation's tensors, waited for
    it: a broadcast after a broadcast hung, within a few hundred)."""
    from nbdist.config import CellOptions

    code = _TRAIN + (
        "g = _train(None).process_group\n"
        "for i in range(3000):\n"
        "    t = torch.full((16,), float(nbdist.rank()))\n"
        "    dist.broadcast(t.data, 0, group=g)\n"
        "    assert t[0] == 0\n"
        "out = [torch.zeros(2) for _ in range(2)]\n"
        "dist.all_gather(out, torch.full((2,), float(nbdist.rank())), group=g)\n"
        "dist.barrier(group=g)\n"
        "(dist.get_backend(g), [o[0].item() for o in out])"
    )
    assert cluster.run(code, CellOptions(timeout=60)) == ("nbdist_shm", [0.0, 1.0])
