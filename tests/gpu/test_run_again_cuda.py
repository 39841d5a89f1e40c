"""Stop, fix, run again on a GPU: a DDP model prepared over NCCL trains on after each stop.

Marked ``gpu``, skipped without CUDA. One GPU gives a one-rank world (NCCL refuses two ranks
on one device): enough for what is GPU-specific here. Each stop ends the formation; its NCCL
communicator is aborted and the next cell's is made; the model is bound to it (a fresh reducer)
and trains on from where it was; the old communicators' memory is given back (the device memory in
use does not grow with the number of stops). An fp16 model with gradient scaling trains on
too, its scaler's state kept.
"""

from __future__ import annotations

import pytest
import torch
from processes import assert_gone

import nbdist
from nbdist.config import CellOptions
from nbdist.errors import DistributedCellError

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

PREPARE = """
import time, torch, torch.distributed as dist
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 8))
net = net.to(nbdist.device())
model, opt = nbdist.prepare(net, torch.optim.SGD(net.parameters(), lr=0.01), **OPTIONS)
steps = 0
"""
TRAIN = """
for _ in range(N):
    x = torch.randn(64, 256, device=nbdist.device())
    with nbdist.train_step(model, opt) as step:
        step.backward(model(x).float().pow(2).mean())
    steps += 1
torch.cuda.synchronize()
"""
STATE = (
    "(steps, round(float(sum(p.detach().double().sum() for p in model.parameters())), 4),"
    " dist.get_backend(model.process_group), (lambda free, total: total - free)("
    "*torch.cuda.mem_get_info()))"
)


@pytest.fixture
def gpu():
    c = nbdist.start(n=1)
    pids = [p.pid for p in c.engines.processes()]
    yield c
    pids += [p.pid for p in c.engines.processes()]
    c.stop()
    assert_gone(pids)


@pytest.mark.parametrize("options", [{}, {"precision": "fp16"}], ids=["fp32", "fp16"])
def test_a_nccl_model_trains_on_after_each_stop(gpu, options):
    gpu.run(f"OPTIONS = {options!r}\n" + PREPARE)
    gpu.run("N = 20\n" + TRAIN)
    used = []
    for _ in range(3):
        with pytest.raises(DistributedCellError, match="ran past --timeout"):
            gpu.run("N = 10**9\n" + TRAIN, CellOptions(timeout=3, stop_wait=60))
        steps, weights, backend, _ = gpu.run(STATE)
        assert backend == "nccl" and steps > 20
        gpu.run("N = 5\n" + TRAIN)
        after = gpu.run(STATE)
        assert after[0] == steps + 5 and after[1] != weights  # trained on, not from scratch
        used.append(after[3])
    print(f"device memory in use after each stop: {[f'{u / 2**20:.0f} MiB' for u in used]}")
    assert used[-1] - used[0] < 64 << 20, used  # the old communicators' memory given back
    if options:
        assert gpu.run("nbdist.worker.state.engine.training_plans[model].scaler is not None")
