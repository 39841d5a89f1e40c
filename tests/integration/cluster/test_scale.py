"""Many engines on this machine: eight take one DDP step and an all-reduce together; 64 light
ones (forked, sharing the fork server's pages) start, run, report and stop."""

from __future__ import annotations

from processes import assert_gone

import nbdist
from nbdist.config import CellOptions

_STEP = """
import torch, torch.nn as nn, torch.nn.functional as F, torch.distributed as dist
torch.manual_seed(nbdist.rank())  # a different start on every rank: DDP must use rank 0's
net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
model, opt = nbdist.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
flat = lambda: torch.cat([p.detach().reshape(-1) for p in model.parameters()])
before = flat()
x, y = torch.randn(8, 16), torch.randn(8, 4)  # different data on every rank
with nbdist.train_step(model, opt) as step:
    step.backward(F.mse_loss(model(x), y))
after = flat()
every = [torch.zeros_like(after) for _ in range(dist.get_world_size())]
dist.all_gather(every, after)
ranks = torch.tensor([float(nbdist.rank())])
dist.all_reduce(ranks)
(dist.get_world_size(), ranks.item(), all(torch.equal(every[0], e) for e in every),
 (after - before).abs().max().item())
"""


def test_eight_ranks_step_together():
    cluster = nbdist.start(n=8)
    pids = [p.pid for p in cluster.engines.processes()]
    try:
        assert [s.rank for s in cluster.slots] == list(range(8))
        assert len({s.pid for s in cluster.slots}) == 8
        world, rank_sum, equal, moved = cluster.run(_STEP)
        assert world == 8
        assert rank_sum == sum(range(8))
        assert equal, "parameters differ between ranks after a DDP step"
        assert moved > 0, "the optimizer did not step"
    finally:
        cluster.stop()
    assert_gone(pids)


_REPORT = """
import time
for i in range(10):
    nbdist.report(step=i, loss=1.0 / (i + 1), acc=0.5, lr=0.01)
    time.sleep(0.05)
nbdist.rank()
"""


def _title(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode().strip()


def test_sixty_four_light_engines_start_run_report_and_stop():
    """64 engines forked from one fork server (sharing its pages: --oversubscribe on 2 cores)
    start, run a cell on every rank, report to a watched run, and stop, leaving no process;
    each process is named in ``ps`` for what it is (``launch.title``)."""
    from nbdist.notebook.run.observers.assembly import assemble

    cluster = nbdist.start(n=64, oversubscribe=True, start_timeout=240)
    procs = cluster.engines.processes()
    pids = [p.pid for p in procs]
    try:
        cid = cluster.engines.cluster_id
        assert [s.rank for s in cluster.slots] == list(range(64))
        for s in cluster.slots:
            assert _title(s.pid) == f"nbdist engine {s.rank} (cluster {cid})"
        assert _title(cluster.engines.server_pid) == f"nbdist forkserver (cluster {cid})"
        others = {_title(p.pid) for p in procs} - {_title(s.pid) for s in cluster.slots}
        assert others == {
            f"nbdist forkserver (cluster {cid})",
            f"nbdist controller (cluster {cid})",
        }
        watch = assemble(_REPORT, CellOptions(dashboard=False), range(64))
        assert cluster.run(_REPORT, watch=watch) == 0
        col = watch.collector
        assert col.records == 64 * 10, col.records
        assert sorted(col.ranks) == list(range(64))
        assert all(st.step == 9 for st in col.ranks.values())
        assert col.series.last("acc") == 0.5
    finally:
        cluster.stop()
    assert_gone(pids)
