"""Pipeline parallelism on a real 2-engine cluster: a 2-stage pipeline trains exactly as one
process training on the whole batch, for both schedules, and every bad input is one UsageError
line on every rank, before any communication (the cluster stays usable)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nbdist.errors import DistributedCellError, UsageError
from nbdist.worker.pipeline import _check_layout

STEPS, BATCH, MICRO = 3, 16, 4

MODEL = """
import torch, torch.nn as nn, torch.nn.functional as F
def make_model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1)
    ).double()
def batches():
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(16, 4, generator=g, dtype=torch.float64),
         torch.randn(16, 1, generator=g, dtype=torch.float64))
        for _ in range(3)
    ]
"""

TRAIN = """
import torch.distributed as dist
from nbdist.worker.pipeline import pipeline
pipe = pipeline(make_model(), split=["2"], microbatches=4, loss_fn=F.mse_loss, schedule=SCHEDULE)
opt = torch.optim.SGD(pipe.stage.parameters(), lr=0.1)
losses = []
for x, y in batches():
    opt.zero_grad()
    losses.append(pipe.step(x, y))
    opt.step()
mine = {k: v.tolist() for k, v in pipe.stage.state_dict().items()}
every = [None] * dist.get_world_size()
dist.all_gather_object(every, (pipe.stage_index, losses, mine))
every
"""


def one_process_reference() -> tuple[list[float], dict[str, np.ndarray]]:
    """One process, whole batches: the losses and the final parameters."""
    scope: dict = {}
    exec(MODEL, scope)
    model = scope["make_model"]()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in scope["batches"]():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.numpy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_pipeline_trains_as_one_process_on_the_whole_batch(cluster, schedule):
    cluster.run(MODEL + f"SCHEDULE = {schedule!r}")
    every = cluster.run(TRAIN)
    want_losses, want_params = one_process_reference()
    assert [index for index, _, _ in every] == [0, 1]  # rank i holds stage i
    for _, losses, _ in every:  # the batch's mean loss, on every rank
        np.testing.assert_allclose(losses, want_losses, rtol=1e-12, atol=1e-12)
    # stage 0 holds layers 0-1, stage 1 layers 2-4, under the model's own names
    assert sorted(every[0][2]) == ["0.bias", "0.weight"]
    assert sorted(every[1][2]) == ["2.bias", "2.weight", "4.bias", "4.weight"]
    got = {k: np.array(v) for _, _, params in every for k, v in params.items()}
    assert sorted(got) == sorted(want_params)
    for name, want in want_params.items():
        np.testing.assert_allclose(got[name], want, rtol=1e-10, atol=1e-12, err_msg=name)


def test_gradients_accumulate_like_backward(cluster):
    """Two steps without zeroing in between leave the sum of both batches' gradients."""
    cluster.run(MODEL)
    every = cluster.run(
        "import torch.distributed as dist\nfrom nbdist.worker.pipeline import pipeline\n"
        "pipe = pipeline(make_model(), split=['2'], microbatches=2, loss_fn=F.mse_loss)\n"
        "for x, y in batches()[:2]:\n    pipe.step(x, y)\n"
        "mine = {k: p.grad.tolist() for k, p in pipe.stage.named_parameters()}\n"
        "every = [None] * dist.get_world_size()\ndist.all_gather_object(every, mine)\nevery"
    )
    scope: dict = {}
    exec(MODEL, scope)
    model = scope["make_model"]()
    for x, y in scope["batches"]()[:2]:
        torch.nn.functional.mse_loss(model(x), y).backward()
    got = {k: np.array(v) for part in every for k, v in part.items()}
    for name, p in model.named_parameters():
        np.testing.assert_allclose(got[name], p.grad.numpy(), rtol=1e-10, atol=1e-12)


BAD = [
    (
        "pipeline(make_model(), split=['9'], microbatches=4, loss_fn=F.mse_loss)",
        "split name '9' is not a layer of the model: name one of its top-level layers "
        "0, 1, 2, 3, 4",
    ),
    (
        "pipeline(make_model(), split=['2', '4'], microbatches=4, loss_fn=F.mse_loss)",
        "3 stages but 2 ranks: use at most 1 split names, or start a cluster with at least 3",
    ),
    (
        "pipeline(make_model(), split=['2'], microbatches=4, loss_fn=F.mse_loss, schedule='zb')",
        "unknown schedule 'zb': use one of 1f1b, gpipe",
    ),
    (
        "pipeline(make_model(), split=['2'], microbatches=1, loss_fn=F.mse_loss)",
        "schedule '1f1b' needs at least as many microbatches as stages (2), not 1",
    ),
    (
        "pipeline(nn.ModuleDict({'a': nn.Linear(2, 2)}), split=['a'], microbatches=2, "
        "loss_fn=F.mse_loss)",
        "pipeline splits an nn.Sequential, not a ModuleDict",
    ),
    (
        "pipe = pipeline(make_model(), split=['2'], microbatches=4, loss_fn=F.mse_loss)\n"
        "pipe.step(torch.zeros(10, 4).double(), torch.zeros(10, 1).double())",
        "a batch of 10 rows does not split into 4 equal microbatches: use a batch size that is "
        "a multiple of 4",
    ),
]


@pytest.mark.parametrize(("code", "expected"), BAD, ids=[b[1][:24] for b in BAD])
def test_bad_input_is_one_line_on_every_rank(cluster, code, expected):
    cluster.run(MODEL + "from nbdist.worker.pipeline import pipeline")
    with pytest.raises(DistributedCellError) as e:
        cluster.run(code)
    assert len(e.value.groups) == 1, e.value.groups  # the same error, on every rank
    ranks, first = e.value.groups[0]
    assert sorted(ranks) == [0, 1]
    assert first.summary.startswith("UsageError: "), first.summary
    assert expected in first.summary, first.summary
    assert "\n" not in first.summary
    alive = "import torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()"
    assert cluster.run(alive) == 2.0  # nobody hangs


def test_world_size_not_divisible_by_the_stages_names_the_fix():
    with pytest.raises(UsageError, match="3 ranks cannot hold whole copies of 2 stages: use a"):
        _check_layout(2, 3)
    for stages, world in ((2, 4), (1, 2), (3, 6)):  # whole replicas are accepted
        _check_layout(stages, world)
