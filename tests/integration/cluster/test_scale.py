"""Eight engines on this machine: one DDP step and an all-reduce across all of them."""

from __future__ import annotations

from processes import assert_gone

import nbdist

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
