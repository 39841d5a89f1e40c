"""A device mesh on a real 8-engine cluster: dp × tp, tp × pp, dp × pp and dp × tp × pp each
train as one process does on the whole batch, from a model built on the meta device, and every
bad combination is one line on every rank before any communication."""

from __future__ import annotations

import pytest
from clusters import cluster_with

from nbdist.config import CellOptions
from nbdist.errors import DistributedCellError

# A small transformer-like stack: blocks of an up and a down projection (the MLP of a
# transformer layer, which Megatron splits column-wise then row-wise), a head.
MODEL = """
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
    def forward(self, x):
        return x + self.down(F.relu(self.up(x)))

def build(meta=True):
    with torch.device("meta" if meta else "cpu"):
        return nn.Sequential(nn.Linear(8, 16), Block(16), Block(16), nn.Linear(16, 4))

PLAN = {"*.up": ColwiseParallel(), "*.down": RowwiseParallel()}
g = torch.Generator().manual_seed(7)
DATA = [(torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)) for _ in range(3)]

def reference():
    # one process, the whole batch: the same initial weights (materialize's, seed 0)
    m = nbdist.materialize(build())
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for x, y in DATA:
        opt.zero_grad(); F.mse_loss(m(x), y).backward(); opt.step()
    return {k: v.detach() for k, v in m.state_dict().items()}

def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t

def worst(module):
    # the largest difference from the reference, over this rank's weights, by name
    ref = reference()
    inner = getattr(module, "module", module)
    diffs = {n: (full(p.detach()) - ref[n]).abs().max().item() for n, p in inner.named_parameters()}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(
        every, (nbdist.rank(), str(nbdist_coords()), max(diffs.values()), sorted(diffs), len(ref))
    )
    return every

def nbdist_coords():
    from nbdist.worker.state import engine
    return engine.mesh
"""

DATA_PARALLEL = """
mesh = nbdist.mesh(dp=DP, tp=TP)
model = nbdist.prepare(build(), mesh=mesh, plan=PLAN)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
me, n = mesh["dp"].get_local_rank(), DP
for x, y in DATA:  # each replica its own rows of the batch
    opt.zero_grad(); F.mse_loss(model(x[me::n]), y[me::n]).backward(); opt.step()
worst(model)
"""

PIPELINED = """
mesh = nbdist.mesh(**SHAPE)
pipe = nbdist.pipeline(build(), split=["2"], microbatches=2, loss_fn=F.mse_loss, mesh=mesh)
if "tp" in SHAPE:
    nbdist.prepare(pipe.stage, mesh=mesh, plan=PLAN)
nbdist.materialize(pipe)
opt = torch.optim.SGD(pipe.stage.parameters(), lr=0.1)
dp = SHAPE.get("dp", 1)
me = mesh["dp"].get_local_rank() if dp > 1 else 0
for x, y in DATA:
    opt.zero_grad(); pipe.step(x[me::dp], y[me::dp]); opt.step()
worst(pipe.stage)
"""


@pytest.fixture(scope="module")
def cluster8():
    """A real 8-engine cluster, stopped after the module's tests."""
    yield from cluster_with(8, MODEL)


def _trains_as_one_process(every: list, shape: str, whole_on_each: bool = False) -> None:
    assert [e[0] for e in every] == list(range(8))
    for rank, coords, diff, names, weights in every:
        assert diff < 1e-6, f"rank {rank} ({coords}) is {diff} from one process"
        # every weight still a parameter after training (DDP over DTensors would lose them)
        assert len(names) == weights if whole_on_each else names, (rank, names)
    assert len({n for e in every for n in e[3]}) == every[0][4], "every weight trained somewhere"
    assert len({e[1] for e in every}) == 8, "each rank its own coordinates"
    assert all(e[1].startswith(shape) for e in every), every


def test_dp_by_tp_trains_as_one_process(cluster8):
    src = DATA_PARALLEL.replace("DP", "4").replace("TP", "2")
    _trains_as_one_process(cluster8.run(src), "dp ", whole_on_each=True)
    status = cluster8.status()
    assert [r.get("mesh") for r in status][:3] == [
        "dp 0/4 tp 0/2",
        "dp 0/4 tp 1/2",
        "dp 1/4 tp 0/2",
    ]


@pytest.mark.parametrize(
    "shape",
    [{"tp": 4, "pp": 2}, {"dp": 4, "pp": 2}, {"dp": 2, "tp": 2, "pp": 2}],
    ids=["tp_by_pp", "dp_by_pp", "dp_by_tp_by_pp"],
)
def test_pipelined_meshes_train_as_one_process(cluster8, shape):
    _trains_as_one_process(cluster8.run(PIPELINED.replace("SHAPE", repr(shape))), "pp ")


@pytest.mark.parametrize(
    "src, says",
    [
        ("nbdist.mesh(dp=3, tp=2)", "dp=3 × tp=2 makes 6 ranks, but the cluster has 8"),
        ("nbdist.mesh()", "name at least one dimension"),
        ("nbdist.mesh(dp=8, tp=0)", "tp must be a whole number >= 1"),
        (
            "nbdist.prepare(build(False), mesh=nbdist.mesh(dp=4, tp=2), plan={'blocks.up': "
            "ColwiseParallel()})",
            "plan names 'blocks.up', which is not a submodule of the model",
        ),
        (
            "nbdist.prepare(build(False), torch.optim.SGD(build(False).parameters(), lr=0.1), "
            "mesh=nbdist.mesh(dp=4, tp=2), sync='local_sgd', sync_every=2)",
            "sync='local_sgd' averages whole models between steps; with tp or pp",
        ),
        ("nbdist.prepare(build(False), plan=PLAN)", "plan= applies over a mesh's tp dimension"),
        (
            "nbdist.pipeline(build(), split=['2'], microbatches=2, loss_fn=F.mse_loss, "
            "mesh=nbdist.mesh(dp=8))",
            "the mesh has pp=1 but the split makes 2 stages",
        ),
    ],
)
def test_bad_meshes_are_one_line_on_every_rank(cluster8, src, says):
    with pytest.raises(DistributedCellError) as info:
        cluster8.run(src, CellOptions(timeout=60))
    failures = info.value.failures
    assert sorted(f.rank for f in failures) == list(range(8)), "every rank, the same line"
    # every rank that reached the check says it; one still making the mesh's groups when the
    # first left them is stopped as that one's bystander (under load, on 2 cores)
    causes = [f for f in failures if not f.bystander]
    assert causes
    assert all(says in f.summary and "\n" not in f.summary for f in causes), [
        (f.rank, f.kind, f.summary) for f in failures
    ]


# A model of 8 blocks of 2 × 2 MiB-matrices (about 64 MiB of float32 weights whole), built on
# the meta device: each rank's peak memory grows by its share and one layer, never the model.
BIG = """
import gc
def peak_growth(make):
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the high-water mark starts again from now
    def hwm():
        with open("/proc/self/status") as f:
            return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmHWM"))
    start = hwm()
    model = make()
    held = sum(
        (p.to_local() if hasattr(p, "to_local") else p).numel() * 4 for p in model.parameters()
    )
    return hwm() - start, held

def big(d=512):
    with torch.device("meta"):
        return nn.Sequential(*[Block(d) for _ in range(8)])

whole = sum(p.numel() * 4 for p in big().parameters())
mesh = nbdist.mesh(tp=8) if STRATEGY == "tp" else nbdist.mesh(dp=8)
def laid_out(d):
    if STRATEGY == "tp":
        return nbdist.prepare(big(d), mesh=mesh, plan=PLAN)
    return nbdist.prepare(big(d), mesh=mesh, strategy="fsdp")

laid_out(16)  # torch's first use of DTensors (imports, caches: ~50 MiB once) is not the model's
grew, held = peak_growth(lambda: laid_out(512))
every = [None] * dist.get_world_size()
dist.all_gather_object(every, (grew, held, whole))
every
"""


@pytest.mark.parametrize("strategy", ["tp", "fsdp"])
def test_a_meta_model_is_never_whole_on_any_rank(cluster8, strategy):
    every = cluster8.run(BIG.replace("STRATEGY", repr(strategy)))
    whole = every[0][2]
    assert whole > 60 * 2**20
    for rank, (grew, held, _) in enumerate(every):
        assert held <= whole / 8 + 2**16, f"rank {rank} holds {held} of {whole} bytes"
        # its share, the largest layer drawn whole, and the allocator's slack: not the model
        assert grew < whole / 3, f"rank {rank} grew by {grew / 2**20:.1f} MiB"


def test_an_optimizer_built_before_prepare_follows_the_new_parameters(cluster8):
    # built on the meta model's parameters: prepare's plan and replicate replace them all
    src = """
model = build()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = nbdist.prepare(model, opt, mesh=nbdist.mesh(dp=4, tp=2), plan=PLAN)
held = {id(p) for g in opt.param_groups for p in g["params"]}
me = nbdist.mesh(dp=4, tp=2)["dp"].get_local_rank()
for x, y in DATA:
    opt.zero_grad(); F.mse_loss(model(x[me::4]), y[me::4]).backward(); opt.step()
(held == {id(p) for p in model.parameters()}, worst(model))
"""
    same, every = cluster8.run(src)
    assert same, "the optimizer steps the model's own parameters"
    _trains_as_one_process(every, "dp ", whole_on_each=True)
