"""Checkpoints you can trust, on a real 2-engine cluster with real signals and a real full disk.

``nbdist.steps`` resumes a killed run to exactly the uninterrupted run's parameters, recomputing
nothing before its checkpoint; a planted pickle runs no code; what a checkpoint cannot hold is
refused when saved; files are private whatever the umask; names of any width; runs sharing a
``dir`` stay apart; a full disk is one retryable error that leaves no temporary file.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import socket
import subprocess
from pathlib import Path

import pytest
import torch
from clusters import logged_steps as _steps
from processes import assert_gone, kill_when

from nbdist.config import CellOptions
from nbdist.errors import DistributedCellError, UsageError
from nbdist.worker.checkpoint.save import files as ckpt_files

STEPS, EVERY, KILL_AT = 32, 5, 12  # checkpoints after steps 4, 9, ... 29 and the last, 31

# Rank 0 logs each step it finished. With KILL set, rank 1 stops at the start of step KILL_AT
# (first attempt only) and waits there for the test to SIGKILL its engine.
TRAIN = f"""
import os, threading, torch
torch.manual_seed(0)
model = nbdist.prepare(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
g = torch.Generator().manual_seed(nbdist.rank())
for step in nbdist.steps({STEPS}, every={EVERY}, dir=DIR, model=model, opt=opt, gen=g):
    if KILL and nbdist.rank() == 1 and step == {KILL_AT} and not os.path.exists(KILL):
        open(KILL, "w").close()
        threading.Event().wait()  # until the test kills this engine
    x = torch.randn(8, 4, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
    opt.step()
    if nbdist.rank() == 0:
        with open(LOG, "a") as f:
            f.write(f"{{step}}\\n")
[p.detach().clone() for p in model.parameters()]
"""


def _setup(cluster, folder: Path, kill: Path | None = None) -> Path:
    log = folder / "steps.log"
    cluster.run(f"DIR, LOG, KILL = {str(folder)!r}, {str(log)!r}, {str(kill) if kill else None!r}")
    return log


@pytest.fixture(scope="module")
def reference(cluster, tmp_path_factory):
    """An uninterrupted run: its parameters and its step log."""
    log = _setup(cluster, tmp_path_factory.mktemp("ref"))
    params = cluster.run(TRAIN)
    assert _steps(log) == list(range(STEPS))
    return params, log


def test_steps_resumes_a_killed_run_exactly_from_its_checkpoint(cluster, reference, tmp_path):
    ref_params, ref_log = reference
    ref_steps = _steps(ref_log)
    kill = tmp_path / "rank1-waits"
    log = _setup(cluster, tmp_path, kill)
    victim = cluster.slots[1].pid
    killed = kill_when(kill, victim)
    params = cluster.run(TRAIN, CellOptions(restarts=1))
    assert killed.is_set()
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params, strict=True))
    steps = _steps(log)
    cut = next(i for i in range(1, len(steps)) if steps[i] <= steps[i - 1])
    first, resumed = steps[:cut], steps[cut:]
    # the last checkpoint before the kill said 10 steps were done (after step 9): the resumed
    # side computes step 10 first, nothing before it, and every later step once
    assert first == list(range(len(first))) and 10 <= len(first) <= KILL_AT
    assert resumed == list(range(10, STEPS))
    # the reference cell, replayed on the fresh engine, resumed from its own final checkpoint
    assert _steps(ref_log) == ref_steps
    assert cluster.slots[1].pid != victim
    assert_gone([victim])


# -- a full disk: a real tmpfs of 64 KiB -------------------------------------------------------


WRITE_BIG = """
import os, torch
with open(ATTEMPTS, "a") as f:
    f.write("attempt\\n")
if FILLER and nbdist.rank() == 0 and len(open(ATTEMPTS).read().split()) > 2:
    os.remove(FILLER)  # space freed before the retry (each rank logs a line per attempt)
nbdist.checkpoint(0, dir=SMALL, run="big", w={"v": torch.ones(SIZE)})
"done"
"""


def _full_run(cluster, tmp_path, small: Path, filler: Path | None, size: int):
    attempts = tmp_path / "attempts.log"
    cluster.run(
        f"SMALL, ATTEMPTS, FILLER, SIZE = {str(small)!r}, {str(attempts)!r}, "
        f"{str(filler) if filler else None!r}, {size}"
    )
    try:
        return cluster.run(WRITE_BIG, CellOptions(restarts=1)), attempts
    finally:
        cluster.run("1")  # the cluster is usable afterwards (and the group re-formed)


def test_a_full_disk_is_one_clear_error_that_restarts_retry(cluster, tmp_path, full_disk):
    with pytest.raises(DistributedCellError) as e:
        _full_run(cluster, tmp_path, full_disk, None, size=20_000)  # 80 KB: never fits
    (ranks, first), *_ = e.value.groups
    assert ranks == [0] and first.kind == "storage"
    folder = full_disk / "big"
    kind, message = first.summary.split(": ", 1)
    assert kind.endswith("CheckpointWriteError")
    assert message == (
        f"nbdist.checkpoint: could not write step-00000000.pt in {folder} (No space left on "
        "device): free space there or pass dir= another folder; --restarts retries the cell"
    )
    assert (tmp_path / "attempts.log").read_text().split() == ["attempt"] * 4  # 2 ranks, twice
    left = sorted(p.name for p in folder.iterdir())
    assert left == ["run.json"]  # which run writes here; no temporary file left behind


def test_a_retry_succeeds_once_space_is_freed(cluster, tmp_path, full_disk):
    filler = full_disk / "filler"
    filler.write_bytes(b"x" * 40_000)
    value, attempts = _full_run(cluster, tmp_path, full_disk, filler, size=4_000)  # 16 KB
    assert value == "done"
    assert attempts.read_text().split() == ["attempt"] * 4
    assert not filler.exists()
    assert sorted(p.name for p in (full_disk / "big").iterdir()) == [
        "run.json",
        "step-00000000.json",
        "step-00000000.pt",
    ]


# -- each promise on its own ------------------------------------------------------------


def test_a_break_leaves_no_checkpoint_of_the_half_done_step(cluster, tmp_path):
    loop = (
        "import torch\nw = {'v': torch.zeros(1)}\ndone = []\n"
        f"for step in nbdist.steps(10, every=2, dir={str(tmp_path)!r}, run='brk', w=w):\n"
        "    w['v'] += 1\n"
        "    if step == 5:\n        break  # half done; (5 + 1) % 2 == 0, yet no checkpoint\n"
        "    done.append(step)\n"
        "done, w['v'].item()"
    )
    assert cluster.run(loop) == ([0, 1, 2, 3, 4], 6.0)
    names = sorted(p.name for p in (tmp_path / "brk").glob("step-*.pt"))
    assert names == ["step-00000001.pt", "step-00000003.pt"]
    # the same named run, resumed, continues after step 3, with the value saved there (4)
    resume = CellOptions(resume=True)
    assert cluster.run(loop.replace("step == 5", "step == 7"), resume) == ([4, 5, 6], 8.0)


class _Planted:
    """Unpickling this runs a shell command: what an attacker would put in a checkpoint."""

    def __init__(self, mark: Path):
        self.mark = mark

    def __reduce__(self):
        return (os.system, (f"touch {self.mark}",))


def _plant(folder: Path, step: int, data: bytes) -> None:
    name = ckpt_files.stem(step)
    (folder / f"{name}.pt").write_bytes(data)
    marker = {"step": step, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / f"{name}.json").write_text(json.dumps(marker))


def _torch_file(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _evil(mark: Path, fmt: str) -> bytes:
    payload = {"format": ckpt_files.FORMAT, "step": 50, "rng": [], "state": {"w": _Planted(mark)}}
    return _torch_file(payload) if fmt == "torch zip" else pickle.dumps(payload)


@pytest.mark.parametrize("fmt", ["torch zip", "bare pickle"])
def test_a_planted_pickle_runs_no_code(cluster, tmp_path, capsys, fmt):
    # the file is truly malicious: an unsafe load of its twin runs the twin's code
    probe = tmp_path / "probe-ran"
    twin = _evil(probe, fmt)
    if fmt == "torch zip":
        torch.load(io.BytesIO(twin), weights_only=False)
    else:
        pickle.loads(twin)
    assert probe.exists()
    cluster.run(
        "import torch\nw = {'v': torch.zeros(1)}\n"
        f"nbdist.checkpoint(1, dir={str(tmp_path)!r}, run='trust', w={{'v': torch.ones(1)}})"
    )
    mark = tmp_path / "code-ran"
    _plant(tmp_path / "trust", 50, _evil(mark, fmt))  # newer, with a matching marker
    got = cluster.run(
        f"step = nbdist.restore(dir={str(tmp_path)!r}, run='trust', w=w)\n(step, w['v'].item())",
        CellOptions(resume=True),
    )
    assert got == (2, 1.0)  # the planted step 50 skipped; the real step 1 loaded
    assert not mark.exists()
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "step-00000050.pt" in x)
    assert line.startswith("nbdist.restore: skipped checkpoint step-00000050.pt: refused to load")
    if fmt == "torch zip":
        assert "GLOBAL posix.system" in line


def test_what_a_checkpoint_cannot_hold_is_refused_when_saved(cluster, tmp_path):
    cases = {
        "arr=np.ones(2)": "state 'arr' is a numpy.ndarray, which a checkpoint cannot hold "
        "safely (loading it could run code): pass torch.from_numpy(arr) or arr.tolist()",
        "cfg={'lr': [1, np.float64(2)]}": "state 'cfg' at ['lr'][1] is a numpy.float64",
        "box={'o': Box()}": "state 'box' at ['o'] is a __main__.Box",
    }
    cluster.run("import numpy as np\nclass Box:\n    pass")
    for arg, message in cases.items():
        with pytest.raises(DistributedCellError) as e:
            cluster.run(f"nbdist.checkpoint(0, dir={str(tmp_path)!r}, run='refused', {arg})")
        (ranks, first), *_ = e.value.groups
        assert ranks == [0] and first.kind == "error"
        kind, said = first.summary.split(": ", 1)
        assert kind.endswith("UsageError") and said.startswith("nbdist.checkpoint: ")
        assert message in said and "\n" not in said
    assert not list(tmp_path.glob("refused/step-*"))
    # restore checks the same, before any training
    with pytest.raises(DistributedCellError, match="state 'arr' is a numpy.ndarray"):
        cluster.run(f"nbdist.restore(dir={str(tmp_path)!r}, arr=np.ones(2))\nSTARTED = True")
    assert cluster.run("'STARTED' in globals()") is False


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o277], ids=oct)
def test_checkpoints_are_private_whatever_the_umask(cluster, tmp_path, umask):
    os.chmod(tmp_path, 0o755)  # the person's own folder is left as it is
    base = tmp_path / "made" / "by" / "nbdist"
    cluster.run(
        "import os, torch\n"
        f"old = os.umask({umask})\n"
        "try:\n"
        f"    nbdist.checkpoint(0, dir={str(base)!r}, run='private', w={{'v': torch.ones(1)}})\n"
        "finally:\n"
        "    os.umask(old)"
    )
    mode = {str(p.relative_to(tmp_path)): p.stat().st_mode & 0o777 for p in tmp_path.rglob("*")}
    assert mode == {
        "made": 0o700,
        "made/by": 0o700,
        "made/by/nbdist": 0o700,
        "made/by/nbdist/private": 0o700,
        "made/by/nbdist/private/step-00000000.pt": 0o600,
        "made/by/nbdist/private/step-00000000.json": 0o600,
        "made/by/nbdist/private/run.json": 0o600,
    }
    assert tmp_path.stat().st_mode & 0o777 == 0o755


def test_step_numbers_of_any_width_sort_and_prune_as_numbers(cluster, tmp_path):
    got = cluster.run(
        "import torch\n"
        "for s in (99_999_998, 99_999_999, 100_000_000, 1_000_000_000):\n"
        f"    nbdist.checkpoint(s, dir={str(tmp_path)!r}, run='wide', keep=2, w={{'s': s}})\n"
        "w = {}\n"
        f"nbdist.restore(dir={str(tmp_path)!r}, run='wide', w=w), w['s']"
    )
    assert got == (1_000_000_001, 1_000_000_000)
    names = sorted(p.name for p in (tmp_path / "wide").glob("step-*.pt"))
    assert names == ["step-100000000.pt", "step-1000000000.pt"]  # the two newest, by number


def test_runs_sharing_a_dir_keep_apart(cluster, tmp_path):
    write = (
        "import torch\nw = {{'who': {who!r}}}\n"
        f"start = nbdist.restore(dir={str(tmp_path)!r}, w=w)\n"
        "for s in range({n}):\n"
        f"    nbdist.checkpoint(s, dir={str(tmp_path)!r}, keep=2, w=w)\n"
        "start"
    )
    assert cluster.run(write.format(who="a", n=5)) == 0
    assert cluster.run(write.format(who="b", n=3)) == 0  # b does not load a's checkpoints
    folders = {p.name: sorted(f.name for f in p.glob("step-*.pt")) for p in tmp_path.iterdir()}
    assert sorted(folders.values()) == [  # and neither pruned the other's
        ["step-00000001.pt", "step-00000002.pt"],
        ["step-00000003.pt", "step-00000004.pt"],
    ]


def test_a_run_name_must_be_one_folder_and_steps_checks_its_arguments(cluster, tmp_path):
    import nbdist

    with pytest.raises(DistributedCellError, match=r"run='\.\./x' cannot name a checkpoint"):
        cluster.run(f"nbdist.restore(dir={str(tmp_path)!r}, run='../x', w={{}})")
    with pytest.raises(UsageError, match="every must be a whole number >= 1, not 0"):
        nbdist.steps(10, every=0, w={})  # refused at the call, before any step
    with pytest.raises(UsageError, match="name what to save"):
        nbdist.steps(10, every=1)
    with pytest.raises(DistributedCellError, match="dir= must be a folder's path, not the int 12 "):
        cluster.run("nbdist.restore(dir=12, w={})")
    with pytest.raises(DistributedCellError, match="cannot be made: embedded null byte"):
        cluster.run("nbdist.restore(dir='a\\0b', w={})")


def test_pruning_removes_what_a_killed_writer_left_and_nothing_else(tmp_path):
    host = socket.gethostname()
    gone = subprocess.Popen(["true"])
    gone.wait()  # a process that has exited: its temporary files are litter
    for step in (1, 2, 3):
        ckpt_files.write(tmp_path, step, _torch_file({"step": step}))
    litter = [
        tmp_path / f".step-00000004.pt.{host}.{gone.pid}.tmp",  # killed mid-write
        tmp_path / "step-00000000.pt",  # killed between the data and its marker
    ]
    kept = [
        tmp_path / f".step-00000004.pt.{host}.{os.getpid()}.tmp",  # a writer still alive
        tmp_path / f".step-00000004.pt.elsewhere.{gone.pid}.tmp",  # another host's: not ours
    ]
    for f in litter + kept:
        f.write_bytes(b"x")
    ckpt_files.prune(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f.name for f in kept]
        + ["step-00000002.pt", "step-00000002.json", "step-00000003.pt", "step-00000003.json"]
    )
