"""The shared-memory all-reduce's protocol on one segment (``nbdist.worker.collectives``), with
each rank a thread of this process: sums in rank order over many rounds, ops, a rank that never
comes, a rank that exited, an abort; and the segment's file. Across engines, and against gloo:
``tests/integration/training/test_shared_memory.py``."""

from __future__ import annotations

import os
import stat
import subprocess
import threading
import time

import pytest
import torch
import torch.distributed as dist

from nbdist.config import ClusterConfig
from nbdist.errors import RankFailure, UsageError
from nbdist.worker.collectives import group, shared_memory
from nbdist.worker.collectives.shared_memory import Aborted, Exchange

pytestmark = pytest.mark.skipif(not shared_memory.supported(), reason="x86-64 Linux only")

SLOT = 4096  # bytes a round: a tensor of a few KiB takes several rounds


def _segment(size: int, slot: int = SLOT) -> int:
    fd, path = group._make(shared_memory.segment_bytes(size, slot))
    os.unlink(path)
    return fd


def _exchanges(size: int, timeout: float = 30.0, pids=None) -> list[Exchange]:
    fd = _segment(size)
    try:
        pids = pids or [os.getpid()] * size
        return [Exchange(fd, r, size, SLOT, pids, timeout) for r in range(size)]
    finally:
        os.close(fd)


def _on_threads(exchanges: list[Exchange], call) -> list:
    """``call(exchange)`` on a thread per rank; each one's result or exception."""
    out: list = [None] * len(exchanges)

    def run(r: int) -> None:
        try:
            out[r] = call(exchanges[r])
        except BaseException as e:  # noqa: B036 - the test looks at what each rank raised
            out[r] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(exchanges))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank never returned"
    return out


def _inputs(size: int, n: int, dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(n)
    return [(torch.randn(n, generator=g) * 100).to(dtype) for _ in range(size)]


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64])
def test_every_rank_gets_the_sum_in_rank_order_over_many_rounds(size, dtype):
    n = 5 * SLOT // torch.tensor([], dtype=dtype).element_size() + 7  # 6 rounds, the last short
    xs = _inputs(size, n, dtype)
    want = xs[0] + xs[1]
    for x in xs[2:]:
        want = want + x
    mine = [x.clone() for x in xs]
    got = _on_threads(_exchanges(size), lambda ex: ex.allreduce(mine[ex.rank], torch.add))
    assert got == [None] * size
    for r in range(size):
        assert torch.equal(mine[r], want), f"rank {r}"


def test_max_min_product_and_a_strided_tensor():
    xs = _inputs(2, 1000, torch.float64)
    for fn in (torch.maximum, torch.minimum, torch.mul):
        mine = [x.clone() for x in xs]
        _on_threads(_exchanges(2), lambda ex, fn=fn, mine=mine: ex.allreduce(mine[ex.rank], fn))
        assert torch.equal(mine[0], fn(xs[0], xs[1])) and torch.equal(mine[1], mine[0])
    grid = [x.view(100, 10).t() for x in _inputs(2, 1000, torch.float32)]  # not contiguous
    mine = [g.clone().t().contiguous().t() for g in grid]
    assert not mine[0].is_contiguous()
    _on_threads(_exchanges(2), lambda ex: ex.allreduce(mine[ex.rank], torch.add))
    assert torch.equal(mine[0], grid[0] + grid[1]) and torch.equal(mine[1], mine[0])


def test_calls_that_differ_fail_on_every_rank_naming_each_ranks_call():
    ex = _exchanges(2)
    mine = [torch.ones(10), torch.ones(12)]
    got = _on_threads(ex, lambda e: e.allreduce(mine[e.rank], torch.add))
    for e in got:
        assert isinstance(e, RuntimeError) and "all-reduce calls differ across ranks" in str(e)
        assert "rank 0: 10 x torch.float32 sum; rank 1: 12 x torch.float32 sum" in str(e)
    ex = _exchanges(2)
    got = _on_threads(ex, lambda e: e.allreduce(torch.ones(4), (torch.add, torch.maximum)[e.rank]))
    assert all("rank 1: 4 x torch.float32 max" in str(e) for e in got), got


def test_an_empty_tensor_is_a_call_like_any_other():
    ex = _exchanges(2)
    assert _on_threads(ex, lambda e: e.allreduce(torch.ones(0), torch.add)) == [None, None]
    mine = [torch.ones(3), torch.ones(3)]
    assert _on_threads(ex, lambda e: e.allreduce(mine[e.rank], torch.add)) == [None, None]
    assert torch.equal(mine[0], torch.full((3,), 2.0))


def test_what_goes_to_gloo_instead():
    cpu = torch.ones(3)
    assert shared_memory.reducer(cpu, dist.ReduceOp.SUM) is torch.add
    assert shared_memory.reducer(cpu, dist.ReduceOp(dist.ReduceOp.MAX)) is torch.maximum
    assert shared_memory.reducer(cpu, dist.ReduceOp.BAND) is None
    assert shared_memory.reducer(torch.ones(3, dtype=torch.bool), dist.ReduceOp.SUM) is None
    assert shared_memory.reducer(torch.ones(3, dtype=torch.complex64), dist.ReduceOp.SUM) is None
    assert shared_memory.reducer(torch.ones(3, device="meta"), dist.ReduceOp.SUM) is None


def test_a_rank_that_never_comes_fails_the_others_after_the_timeout_naming_it():
    ex = _exchanges(3, timeout=0.3)
    t0 = time.monotonic()
    got = _on_threads(ex[:2], lambda e: e.allreduce(torch.ones(10), torch.add))
    assert time.monotonic() - t0 < 10
    assert all(isinstance(e, Aborted) and "for ranks [2]" in str(e) for e in got), got
    # the group is over: a later call fails at once, on every rank, the latecomer's too
    with pytest.raises(Aborted):
        ex[2].allreduce(torch.ones(10), torch.add)


def test_a_rank_whose_process_exited_fails_the_others_within_moments():
    gone = subprocess.Popen(["true"])
    gone.wait()
    ex = _exchanges(2, pids=[os.getpid(), gone.pid])
    t0 = time.monotonic()
    with pytest.raises(Aborted, match=rf"rank 1 \(pid {gone.pid}\) exited during an all-reduce"):
        ex[0].allreduce(torch.ones(10), torch.add)
    assert time.monotonic() - t0 < 5  # checked every 50 ms; the timeout is 30 s
    with pytest.raises(Aborted, match=rf"rank 1 \(pid {gone.pid}\) exited") as info:
        ex[1].allreduce(torch.ones(10), torch.add)  # every rank gives the one reason
    assert RankFailure(0, f"Aborted: {info.value}").bystander  # its root cause is elsewhere


def test_an_abort_stops_a_waiting_rank_at_once():
    ex = _exchanges(2)
    waiting = threading.Event()
    out: list = []

    def wait() -> None:
        waiting.set()
        try:
            ex[0].allreduce(torch.ones(10), torch.add)
        except Aborted as e:
            out.append(e)

    t = threading.Thread(target=wait)
    t.start()
    assert waiting.wait(10)
    ex[1].abort("rank 1 left the group")
    t.join(10)
    assert not t.is_alive()
    assert "rank 1 left the group" in str(out[0])


def test_an_interrupt_while_waiting_stops_the_others():
    ex = _exchanges(2)
    ex[0]._wait = lambda: (_ for _ in ()).throw(KeyboardInterrupt())  # the person's interrupt
    with pytest.raises(KeyboardInterrupt):
        ex[0].allreduce(torch.ones(10), torch.add)
    with pytest.raises(Aborted, match="KeyboardInterrupt on rank 0"):
        ex[1].allreduce(torch.ones(10), torch.add)


def test_the_segment_file_is_its_owners_alone_and_allocated():
    nbytes = shared_memory.segment_bytes(2, SLOT)
    fd, path = group._make(nbytes)
    try:
        st = os.fstat(fd)
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
        assert st.st_size == nbytes and st.st_blocks * 512 >= nbytes
        assert os.path.basename(path).startswith("nbdist-shm-")
    finally:
        os.close(fd)
        os.unlink(path)


def test_a_segment_stays_within_a_small_dev_shm_whatever_the_ranks():
    for size in (2, 8, 64, 512):
        assert shared_memory.segment_bytes(size, group._slot(size)) <= 80 << 20
        assert group._slot(size) % 64 == 0


def test_the_setting_is_checked():
    assert ClusterConfig(n=2, shared_memory=False).shared_memory is False
    with pytest.raises(UsageError, match="shared_memory"):
        ClusterConfig(n=2, shared_memory="no")


_ABORT_ALL = """
import torch.distributed as dist
from nbdist.worker.collectives import group
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
group.register()
g = dist.new_group(backend=group.NAME)
assert dist.get_backend(g) == group.NAME and isinstance(g, group.LocalGroup)
dist.distributed_c10d._abort_process_group()  # what rendezvous.abort does: every group's abort()
print("aborted")
"""


def test_torchs_abort_of_every_group_takes_the_local_group_too():
    import sys

    done = subprocess.run([sys.executable, "-c", _ABORT_ALL], capture_output=True, text=True)
    assert done.stdout.strip() == "aborted", done.stderr[-2000:]
