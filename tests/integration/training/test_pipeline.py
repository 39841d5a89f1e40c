"""Pipeline parallelism on a real 2-engine cluster: a 2-stage pipeline trains exactly as one
process training on the whole batch, for both schedules; every bad input is one UsageError
line on every rank, before any communication (the cluster stays usable); each step is measured
and each rank's stage shown; checkpoints keep every stage, and a run that loses a rank ends with
the uninterrupted run's parameters."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from processes import assert_gone, kill_when

from nbdist.config import CellOptions
from nbdist.errors import DistributedCellError, UsageError
from nbdist.notebook.magics import _status_table
from nbdist.worker.checkpoint import contents
from nbdist.worker.pipeline.stages import _check_layout

STEPS, BATCH, MICRO = 3, 16, 4

MODEL = """
import torch, torch.nn as nn, torch.nn.functional as F
class Net(nn.Module):
    # not an nn.Sequential: a loop over a ModuleList, with a residual connection
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(4, 8)
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.out = nn.Linear(8, 1)
    def forward(self, x):
        h = torch.tanh(self.inp(x))
        for layer in self.layers:
            h = h + torch.tanh(layer(h))
        return self.out(h)
class Branchy(nn.Module):
    # a forward torch.export cannot trace: it branches on a value
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 1)
    def forward(self, x):
        return self.b(self.a(x) if x.sum() > 0 else x)
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
from nbdist.worker.pipeline.stages import pipeline
model = (Net().double() if TRACED else make_model())
pipe = pipeline(
    model, split=["layers.1"] if TRACED else ["2"], microbatches=4, loss_fn=F.mse_loss,
    schedule=SCHEDULE, example=batches()[0][0] if TRACED else None
)
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


def one_process_reference(traced: bool = False) -> tuple[list[float], dict[str, np.ndarray]]:
    """One process, whole batches: the losses and the final parameters."""
    scope: dict = {}
    exec(MODEL, scope)
    model = scope["Net"]().double() if traced else scope["make_model"]()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in scope["batches"]():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.numpy() for k, v in model.state_dict().items()}


# Stage 0's parameters, under the model's own names: an nn.Sequential cut before layer 2, and a
# traced Net cut before layers.1.
STAGE0 = {
    False: ["0.bias", "0.weight"],
    True: ["inp.bias", "inp.weight", "layers.0.bias", "layers.0.weight"],
}


@pytest.mark.parametrize("traced", [False, True], ids=["sequential", "traced"])
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_pipeline_trains_as_one_process_on_the_whole_batch(cluster, schedule, traced):
    cluster.run(MODEL + f"SCHEDULE, TRACED = {schedule!r}, {traced}")
    every = cluster.run(TRAIN)
    want_losses, want_params = one_process_reference(traced)
    assert [index for index, _, _ in every] == [0, 1]  # rank i holds stage i
    for _, losses, _ in every:  # the batch's mean loss, on every rank
        np.testing.assert_allclose(losses, want_losses, rtol=1e-12, atol=1e-12)
    assert sorted(every[0][2]) == STAGE0[traced]
    assert not set(every[0][2]) & set(every[1][2])  # each layer in one stage only
    got = {k: np.array(v) for _, _, params in every for k, v in params.items()}
    assert sorted(got) == sorted(want_params)
    for name, want in want_params.items():
        np.testing.assert_allclose(got[name], want, rtol=1e-10, atol=1e-12, err_msg=name)


def test_gradients_accumulate_like_backward(cluster):
    """Two steps without zeroing in between leave the sum of both batches' gradients."""
    cluster.run(MODEL)
    every = cluster.run(
        "import torch.distributed as dist\nfrom nbdist.worker.pipeline.stages import pipeline\n"
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
        "pipeline(make_model().state_dict(), split=['2'], microbatches=2, loss_fn=F.mse_loss)",
        "pipeline cuts a torch nn.Module, not a OrderedDict",
    ),
    (
        "pipeline(Net(), split=['layers.1'], microbatches=2, loss_fn=F.mse_loss)",
        "pipeline needs example= to cut a Net (it is traced on one microbatch)",
    ),
    (
        "pipeline(Net(), split=['layers.7'], microbatches=2, loss_fn=F.mse_loss, "
        "example=torch.zeros(4, 4).double())",
        "split name 'layers.7' is not a submodule of the Net: name submodules as "
        "model.named_modules() does (its top level: inp, layers, out)",
    ),
    (
        "pipeline(Branchy(), split=['b'], microbatches=2, loss_fn=F.mse_loss, "
        "example=torch.ones(4, 4))",
        "pipeline could not trace the Branchy (",
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
    cluster.run(MODEL + "from nbdist.worker.pipeline.stages import pipeline")
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


def test_each_step_is_measured_and_status_shows_each_ranks_stage(cluster):
    cluster.run(MODEL)
    measured = cluster.run(
        "import torch.distributed as dist\nfrom nbdist.worker.pipeline.stages import pipeline\n"
        "pipe = pipeline(make_model(), split=['2'], microbatches=4, loss_fn=F.mse_loss)\n"
        "assert pipe.last_step_time is None and pipe.idle_share is None\n"
        "for x, y in batches():\n    pipe.step(x, y)\n"
        "every = [None] * dist.get_world_size()\n"
        "dist.all_gather_object(every, (pipe.last_step_time, pipe.idle_share))\nevery"
    )
    for seconds, idle in measured:
        assert 0 < seconds < 10 and 0 <= idle <= 1, measured
    rows = cluster.status()
    assert [(r["stage"], r["replica"]) for r in rows] == [("0/2", "0/1"), ("1/2", "0/1")]
    table = _status_table(rows).splitlines()
    assert table[0].split()[-2:] == ["stage", "replica"]
    assert table[1].split()[-2:] == ["0/2", "0/1"] and table[2].split()[-2:] == ["1/2", "0/1"]


# Trains with nbdist.steps, checkpointing each rank's stage and its optimizer every 2 steps;
# rank 0 marks the step at which to kill rank 1 (once, on the first attempt).
RESUMABLE = """
import pathlib, time
from nbdist.worker.pipeline.stages import pipeline
torch.manual_seed(0)
model = make_model()
pipe = pipeline(model, split=["2"], microbatches=4, loss_fn=F.mse_loss)
opt = torch.optim.Adam(pipe.stage.parameters(), lr=0.01)
g = torch.Generator().manual_seed(5)
for step in nbdist.steps(12, every=2, model=model, opt=opt, gen=g, run=RUN, dir=DIR):
    x = torch.randn(16, 4, generator=g, dtype=torch.float64)
    y = x.sum(1, keepdim=True)
    opt.zero_grad()
    pipe.step(x, y)
    opt.step()
    if nbdist.rank() == 0 and step == 6 and FLAG and not pathlib.Path(FLAG).exists():
        pathlib.Path(FLAG).write_text("6")
    time.sleep(0.05)
import torch.distributed as dist
every = [None] * dist.get_world_size()
dist.all_gather_object(every, {k: v.tolist() for k, v in pipe.stage.state_dict().items()})
every
"""


def _params(every) -> dict[str, np.ndarray]:
    return {k: np.array(v) for part in every for k, v in part.items()}


def test_a_pipeline_that_loses_a_rank_resumes_every_stage_from_its_checkpoint(cluster, tmp_path):
    cluster.run(MODEL + f"DIR = {str(tmp_path / 'ckpt')!r}")
    want = _params(cluster.run("RUN, FLAG = 'pipe-ref', None\n" + RESUMABLE))
    flag = tmp_path / "reached"
    cluster.run(f"RUN, FLAG = 'pipe-killed', {str(flag)!r}")
    victim = cluster.slots[1].pid
    killed = kill_when(flag, victim)
    got = _params(cluster.run(RESUMABLE, CellOptions(restarts=1)))
    assert killed.is_set() and cluster.slots[1].pid != victim
    assert_gone([victim])
    assert sorted(got) == sorted(want)
    for name in want:  # every stage resumed as it was: Adam's moments included
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-12, err_msg=name)
    # the checkpoint is sharded, each stage under its own prefix, holding its own layers only
    # (rank 0's stale copy of stage 1's layers is not saved)
    folder = sorted((tmp_path / "ckpt" / "pipe-ref").glob("step-*.dcp"))[-1]
    assert json.loads(folder.with_suffix(".json").read_text())["stages"] == [0, 1]
    keys = contents.load_metadata(folder / ".metadata").state_dict_metadata
    assert sorted(k for k in keys if ".model." in k) == [
        f"stage.{s}.model.{layer}.{p}"
        for s, layer in ((0, 0), (1, 2), (1, 4))
        for p in ("bias", "weight")
    ]


def test_each_rank_keeps_only_its_own_stage_once_the_model_is_dropped(cluster):
    """The other stages' parameters are freed: a model too big for one worker stays split."""
    cluster.run(MODEL)
    kept = cluster.run(
        "import gc, weakref\nfrom nbdist.worker.pipeline.stages import pipeline\n"
        "x, y = batches()[0]\n"
        "def alive_after(model, **kw):\n"
        "    refs = {n: weakref.ref(p) for n, p in model.named_parameters()}\n"
        "    pipe = pipeline(model, microbatches=4, loss_fn=F.mse_loss, **kw)\n"
        "    del model\n"
        "    pipe.step(x, y)\n"
        "    gc.collect()\n"
        "    return pipe, sorted(n for n, r in refs.items() if r() is not None)\n"
        "seq, seq_alive = alive_after(make_model(), split=['2'])\n"
        "net, net_alive = alive_after(Net().double(), split=['layers.1'], example=x)\n"
        "import torch.distributed as dist\n"
        "every = [None] * dist.get_world_size()\n"
        "dist.all_gather_object(every, (seq_alive, net_alive))\nevery"
    )
    assert kept[0] == (STAGE0[False], STAGE0[True])
    assert kept[1] == (
        ["2.bias", "2.weight", "4.bias", "4.weight"],
        sorted(f"{m}.{p}" for m in ("layers.1", "layers.2", "out") for p in ("bias", "weight")),
    )
    with pytest.raises(DistributedCellError, match="this pipeline was traced on microbatches of"):
        cluster.run("net.step(torch.zeros(8, 4).double(), torch.zeros(8, 1).double())")
