"""Sharded checkpoints on a real 4-engine cluster: a model whose weights are DTensors (DDP over
tensor parallel, FSDP2 over tensor parallel) is written by every rank as its own shards, into a
private folder made whole by its marker; a run that loses a rank resumes to the uninterrupted
run's parameters, bit for bit; the shards load onto another mesh (tp=4, FSDP2 over 4); a damaged
shard or a planted metadata pickle is skipped for the older good checkpoint; a folder a rank
cannot see, or a full disk, is one line on every rank and leaves nothing behind. On disk, both
formats side by side: the newest that verifies wins, and pruning and moving aside take both."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import shutil
import socket
import stat
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from clusters import cluster_with
from processes import assert_gone, kill_when

from nbdist.config import CellOptions
from nbdist.errors import DistributedCellError, UsageError
from nbdist.worker.checkpoint import contents, files, owner

STEPS, EVERY, KILL_AT = 6, 2, 4  # checkpoints after steps 1, 3, 5 (the last 2 kept); rank 1
# dies at step 4, and the run resumes after step 3

# layouts over 4 ranks: "ddp" dp=2 x tp=2 (nbdist.prepare(mesh=, plan=): tensor parallel,
# replicated over dp), "fsdp" dp=2 x tp=2 (FSDP2 over tensor parallel), "tp" tp=4, "dp" FSDP2 over 4
MODEL = """
import os, threading, torch, torch.nn as nn, torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

def build(layout):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 64))
    plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
    if layout == "ddp":
        return nbdist.prepare(model, mesh=nbdist.mesh(dp=2, tp=2), plan=plan)
    shape = {"tp": (1, 4), "dp": (4, 1)}.get(layout, (2, 2))
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp"))
    if layout != "dp":
        parallelize_module(model, mesh["tp"], plan)
    if layout in ("fsdp", "dp"):
        fully_shard(model, mesh=mesh["dp"])
    return model

def full(model):
    # every weight whole, by name (after a forward, as training leaves them)
    with torch.no_grad():
        model(torch.zeros(2, 64))
    inner = getattr(model, "module", model)
    whole = lambda t: (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()
    return {f"{i}.{p}": whole(getattr(inner[i], p)) for i in (0, 2) for p in ("weight", "bias")}

def train(step, model, opt, g):
    x = torch.randn(16, 64, generator=g)
    opt.zero_grad()
    F.mse_loss(model(x), x).backward()
    opt.step()
"""

# Trains LAYOUT for STEPS steps with nbdist.steps; with KILL set, rank 1 stops at step KILL_AT
# (first attempt only) and waits there for the test to SIGKILL its engine.
RUN = f"""
model = build(LAYOUT)
opt = torch.optim.Adam(model.parameters(), lr=0.01)
g = torch.Generator().manual_seed(1)
for step in nbdist.steps({STEPS}, {EVERY}, dir=DIR, run=RUN, keep=2, model=model, opt=opt, gen=g):
    if KILL and nbdist.rank() == 1 and step == {KILL_AT} and not os.path.exists(KILL):
        open(KILL, "w").close()
        threading.Event().wait()  # until the test kills this engine
    train(step, model, opt, g)
full(model)
"""

RESTORE = """
model = build(LAYOUT)
opt = torch.optim.Adam(model.parameters(), lr=0.01)
start = nbdist.restore(dir=DIR, run=RUN, model=model, opt=opt)
(start, full(model))
"""


@pytest.fixture(scope="module")
def cluster4(tmp_path_factory):
    """A real 4-engine nbdist cluster, stopped after the module's tests."""
    yield from cluster_with(4, MODEL + f"DIR = {str(tmp_path_factory.mktemp('ck'))!r}")


def _dir(cluster) -> Path:
    return Path(cluster.run("DIR"))


def _same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for name in a:  # bit for bit
        assert torch.equal(a[name], b[name]), name


@pytest.fixture(scope="module")
def reference(cluster4):
    """An uninterrupted dp=2 x tp=2 run (DDP over tensor parallel): its whole weights."""
    return cluster4.run("LAYOUT, RUN, KILL = 'ddp', 'ref', None\n" + RUN)


@pytest.fixture(scope="module")
def fsdp_steps(cluster4):
    """An FSDP2 dp=2 x tp=2 model checkpointed after steps 0 and 1 (with its optimizer, an LR
    scheduler and a dict of plain values): its weights at each."""
    return cluster4.run(
        "model = build('fsdp')\nopt = torch.optim.Adam(model.parameters(), lr=0.01)\n"
        "sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)\n"
        "g, saved = torch.Generator().manual_seed(1), []\n"
        "for step in range(2):\n    train(step, model, opt, g)\n    sched.step()\n"
        "    info = {'step': step, 'w': torch.full((3,), float(step))}\n"
        "    nbdist.checkpoint(step, dir=DIR, run='fsdp', model=model, opt=opt, sched=sched, "
        "info=info)\n"
        "    saved.append(full(model))\nsaved"
    )


def _copy(cluster, run: str, name: str) -> Path:
    """The checkpoints of ``run`` copied as run ``name``, to be damaged there."""
    folder = _dir(cluster) / name
    shutil.copytree(_dir(cluster) / run, folder)
    return folder


def _restore(cluster, layout: str, run: str, **opts):
    return cluster.run(
        f"LAYOUT, RUN = {layout!r}, {run!r}\n" + RESTORE, CellOptions(resume=True, **opts)
    )


# first: recovery replays every cell the cluster ran before, so it is quickest with few
def test_a_run_that_loses_a_rank_ends_bit_for_bit_as_the_uninterrupted_run(
    cluster4, reference, tmp_path
):
    kill = tmp_path / "rank1-waits"
    cluster4.run(f"LAYOUT, RUN, KILL = 'ddp', 'killed', {str(kill)!r}")
    victim = cluster4.slots[1].pid
    killed = kill_when(kill, victim)
    got = cluster4.run(RUN, CellOptions(restarts=1))
    assert killed.is_set() and cluster4.slots[1].pid != victim
    assert_gone([victim])
    _same(got, reference)


def test_every_rank_writes_its_own_shards_privately_under_a_marker(cluster4, reference):
    folder = _dir(cluster4) / "ref"
    assert sorted(p.name for p in folder.glob("step-*")) == [
        f"step-{s:08d}.{kind}" for s in (3, 5) for kind in ("dcp", "json")
    ]  # the newest 2 kept, of 3 written
    newest = folder / "step-00000005.dcp"
    names = sorted(p.name for p in newest.iterdir())
    assert names == [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"]
    assert stat.S_IMODE(newest.stat().st_mode) == 0o700
    marker = json.loads((folder / "step-00000005.json").read_text())
    assert marker["world_size"] == 4 and marker["step"] == 5
    for name in names:
        data = (newest / name).read_bytes()
        assert stat.S_IMODE((newest / name).stat().st_mode) == 0o600, name
        assert marker["files"][name] == [len(data), hashlib.sha256(data).hexdigest()], name
    # no file holds the whole model: each rank wrote about a quarter of weights and moments
    whole = sum(t.numel() * 4 for t in reference.values()) * 3  # weights, exp_avg, exp_avg_sq
    shards = [(newest / f"__{r}_0.distcp").stat().st_size for r in range(4)]
    assert all(size < 0.4 * whole for size in shards), (shards, whole)
    assert sum(shards) > whole  # and together, all of it


def test_a_rank_that_cannot_see_the_folder_stops_every_rank_in_one_line(cluster4):
    cluster4.run(
        "from nbdist.worker.checkpoint import sharded\nSEES = sharded._sees\n"
        "sharded._sees = lambda tmp, token: nbdist.rank() < 2 and SEES(tmp, token)"
    )
    try:
        with pytest.raises(DistributedCellError) as e:
            cluster4.run("nbdist.checkpoint(0, dir=DIR, run='unshared', model=build('tp'))")
    finally:
        cluster4.run("sharded._sees = SEES")
    (ranks, first), *rest = e.value.groups
    assert ranks == [0, 1, 2, 3] and not rest  # the same line on every rank
    said = first.summary.split(": ", 1)[1]
    assert said.startswith("ranks 2, 3 (on ") and "\n" not in said
    assert said.endswith("pass dir= a folder on a file system every host shares")
    assert not [p for p in (_dir(cluster4) / "unshared").iterdir() if "step-" in p.name]


def test_a_checkpoint_loads_onto_another_mesh(cluster4, reference, fsdp_steps):
    start, got = _restore(cluster4, "tp", "ref")  # DDP over dp=2 x tp=2, onto tp=4
    assert start == STEPS
    _same(got, reference)
    start, got = _restore(cluster4, "dp", "fsdp")  # FSDP2 over dp=2 x tp=2, onto FSDP2 over 4
    assert start == 2
    _same(got, fsdp_steps[1])


def test_fsdp2_round_trip_and_a_damaged_shard_falls_back(cluster4, fsdp_steps, capsys):
    start, got, epoch, lr, info, restored = cluster4.run(
        "model = build('fsdp')\nopt = torch.optim.Adam(model.parameters(), lr=0.01)\n"
        "sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)\ninfo = {}\n"
        "start = nbdist.restore(dir=DIR, run='fsdp', model=model, opt=opt, sched=sched, "
        "info=info)\n(start, full(model), sched.last_epoch, opt.param_groups[0]['lr'], info, "
        "nbdist.restored())",
        CellOptions(resume=True),
    )
    assert (start, epoch, lr) == (2, 2, 0.0025)
    _same(got, fsdp_steps[1])
    assert info["step"] == 1 and torch.equal(info["w"], torch.ones(3))  # refilled in place
    assert sorted(restored) == ["info"]
    folder = _copy(cluster4, "fsdp", "damaged")
    shard = folder / "step-00000001.dcp" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    capsys.readouterr()
    start, got = _restore(cluster4, "fsdp", "damaged")
    assert start == 1  # step 0's checkpoint
    _same(got, fsdp_steps[0])
    out = capsys.readouterr().out
    assert (
        "nbdist.restore: skipped checkpoint step-00000001.dcp: checksum mismatch in __1_0.distcp\n"
    ) in out


class _Planted:
    def __init__(self, mark: Path) -> None:
        self.mark = mark

    def __reduce__(self):
        return (os.system, (f"touch {self.mark}",))


def test_a_planted_metadata_pickle_is_refused_without_running_it(cluster4, fsdp_steps, tmp_path):
    mark = tmp_path / "code-ran"
    evil = pickle.dumps({"metadata": _Planted(mark)})
    folder = _copy(cluster4, "fsdp", "planted")
    step = folder / "step-00000001.dcp"
    (step / ".metadata").write_bytes(evil)  # and its marker rewritten to match: it verifies
    marker = json.loads((folder / "step-00000001.json").read_text())
    marker["files"][".metadata"] = [len(evil), hashlib.sha256(evil).hexdigest()]
    (folder / "step-00000001.json").write_text(json.dumps(marker))
    with pytest.raises(UsageError) as e:
        contents.load_metadata(step / ".metadata")
    assert str(e.value) == (
        f"{step / '.metadata'} names posix.system, which a checkpoint's metadata never holds: "
        "refused to load it (loading it could run code); delete that checkpoint"
    )
    start, got = _restore(cluster4, "fsdp", "planted")
    assert start == 1  # the planted step 1 skipped, step 0 loaded
    _same(got, fsdp_steps[0])
    assert not mark.exists()


def test_a_full_disk_is_one_retryable_line_on_every_rank_and_leaves_nothing(cluster4, full_disk):
    with pytest.raises(DistributedCellError) as e:  # a quarter of 0.5 MB per rank: never fits
        cluster4.run(f"nbdist.checkpoint(0, dir={str(full_disk)!r}, run='big', model=build('tp'))")
    (ranks, first), *rest = e.value.groups
    assert ranks == [0, 1, 2, 3] and not rest and first.kind == "storage"
    kind, said = first.summary.split(": ", 1)
    assert kind.endswith("CheckpointWriteError") and "\n" not in said
    assert said.startswith(
        f"nbdist.checkpoint: could not write the shards of step 0 in {full_disk / 'big'} (rank "
    )
    assert said.endswith(
        ": No space left on device): free space there or pass dir= another folder; --restarts "
        "retries the cell"
    )
    assert sorted(p.name for p in (full_disk / "big").iterdir()) == ["run.json"]


def test_a_planted_byte_item_is_refused_without_running_it(tmp_path):
    """DCP's own planner loads byte items (all but tensors) with weights_only=False."""
    from nbdist.worker.checkpoint import storage

    mark = tmp_path / "code-ran"
    planner = storage.SafePlanner()
    planner.original_state_dict = {"state": {"w": None}}
    planner.mappings = {"state.w": ("state", "w")}
    item = SimpleNamespace(dest_index=SimpleNamespace(fqn="state.w"))
    evil = io.BytesIO()
    torch.save({"v": _Planted(mark)}, evil)
    evil.seek(0)
    with pytest.raises(UsageError) as e:
        planner.load_bytes(item, evil)
    said = str(e.value)
    assert said.startswith(
        "nbdist.restore: the checkpoint's item 'state.w' is not made of tensors and plain "
        "values (refused to load: "
    )
    assert "posix.system" in said and "\n" not in said
    assert not mark.exists()
    fine = io.BytesIO()
    torch.save(({"step": 3},), fine)
    fine.seek(0)
    planner.load_bytes(item, fine)  # what a weights-only load takes lands in its place
    assert planner.original_state_dict == {"state": {"w": ({"step": 3},)}}


# -- on disk, without a cluster: both formats side by side ---------------------------------


def _sharded_on_disk(folder: Path, step: int, marked: bool = True) -> Path:
    """A sharded checkpoint as ``storage.commit`` leaves it: DCP's (empty) metadata, a shard."""
    from torch.distributed.checkpoint.metadata import Metadata

    where = folder / f"{files.stem(step)}.dcp"
    where.mkdir(parents=True)
    (where / ".metadata").write_bytes(pickle.dumps(Metadata(state_dict_metadata={})))
    (where / "__0_0.distcp").write_bytes(b"shard %d" % step)
    listing = {p.name: list(files.digest(p)) for p in where.iterdir()}
    if marked:
        marker = {"step": step, "format": "dcp", "world_size": 1, "files": listing}
        (folder / f"{files.stem(step)}.json").write_text(json.dumps(marker))
    return where


def _gathered_on_disk(folder: Path, step: int) -> None:
    buf = io.BytesIO()
    torch.save({"format": files.FORMAT, "step": step}, buf)
    files.write(folder, step, buf.getvalue())


def test_the_newest_checkpoint_that_verifies_wins_whatever_its_format(tmp_path):
    _gathered_on_disk(tmp_path, 3)
    _sharded_on_disk(tmp_path, 5)
    found, skipped = files.load_latest(tmp_path)
    assert (found["format"], found["step"], skipped) == ("dcp", 5, [])
    assert found["path"] == str(tmp_path / "step-00000005.dcp")
    (tmp_path / "step-00000005.dcp" / "__0_0.distcp").write_bytes(b"rotten!")
    found, skipped = files.load_latest(tmp_path)
    assert (found["format"], found["step"]) == (files.FORMAT, 3)
    assert skipped == ["step-00000005.dcp: checksum mismatch in __0_0.distcp"]
    _gathered_on_disk(tmp_path, 5)  # the same step written again, gathered: it replaces
    assert [p.name for _, p in files.complete(tmp_path)] == ["step-00000005.pt", "step-00000003.pt"]
    assert not (tmp_path / "step-00000005.dcp").exists()


def test_pruning_removes_sharded_leftovers_and_an_earlier_run_moves_aside(tmp_path):
    folder = tmp_path / "run"
    host = socket.gethostname()
    gone = subprocess.Popen(["true"])
    gone.wait()  # a process that has exited: its temporary folders are litter
    for step in (1, 2, 3):
        _sharded_on_disk(folder, step)
    _sharded_on_disk(folder, 0, marked=False)  # killed between the rename and its marker
    _sharded_on_disk(folder, 4, marked=False)  # newer: it may still be being marked
    litter = folder / f".step-00000004.dcp.{host}.{gone.pid}.tmp"
    alive = folder / f".step-00000004.dcp.{host}.{os.getpid()}.tmp"
    for d in (litter, alive):
        d.mkdir()
        (d / "__0_0.distcp").write_bytes(b"x")
    files.prune(folder, keep=2)
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [alive.name, "step-00000004.dcp"]
        + [f"step-{s:08d}.{kind}" for s in (2, 3) for kind in ("dcp", "json")]
    )
    note = owner.claim(folder, "another-run", resume=False)
    assert note.startswith("nbdist: run 'run' already had checkpoints (4 steps done)")
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("run.earlier-")]
    assert (aside / "step-00000003.dcp" / "__0_0.distcp").exists()
    assert sorted(p.name for p in folder.iterdir()) == ["run.json"]
