"""Checkpoints and recovery on a real cluster, with real signals.

Every recovery test compares the final parameters with an uninterrupted run's.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest
import torch
from clusters import logged_steps as _steps
from processes import assert_gone, wait_until

from nbdist.config import CellOptions
from nbdist.errors import DistributedCellError, UsageError

STEPS, EVERY = 40, 5

# A training cell that checkpoints every EVERY steps and logs each step it computes (rank 0).
TRAIN = f"""
import torch, time, pathlib
torch.manual_seed(0)
model = nbdist.prepare(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(nbdist.rank())
start = nbdist.restore(model=model, opt=opt, gen=g)
for step in range(start, {STEPS}):
    x = torch.randn(8, 4, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
    opt.step()
    nbdist.checkpoint(step, every={EVERY}, model=model, opt=opt, gen=g)
    if nbdist.rank() == 0:
        with open(LOG, "a") as f:
            f.write(f"{{step}}\\n")
    time.sleep(0.05)
[p.detach().clone() for p in model.parameters()]
"""


@pytest.fixture(scope="module")
def reference(cluster, tmp_path_factory):
    """The parameters of an uninterrupted run."""
    log = tmp_path_factory.mktemp("ref") / "steps.log"
    cluster.run(f"LOG = {str(log)!r}")
    return cluster.run(TRAIN)


def _same(a, b) -> bool:
    return all(torch.allclose(x, y, atol=1e-6) for x, y in zip(a, b, strict=True))


def _run_with_fault(cluster, tmp_path, fault, restarts=2, at_step=12):
    log = tmp_path / "steps.log"
    cluster.run(f"LOG = {str(log)!r}")
    victim = cluster.slots[1].pid
    hit = threading.Event()

    def inject():
        try:
            wait_until(lambda: len(_steps(log)) >= at_step, 60, what="training to reach the step")
            os.kill(victim, fault)
            hit.set()
        except Exception:
            pass

    t = threading.Thread(target=inject, daemon=True)
    t.start()
    result = cluster.run(TRAIN, CellOptions(restarts=restarts))
    t.join(5)
    assert hit.is_set(), "the fault was never injected"
    return result, _steps(log), victim


def test_sigkill_mid_training_recovers_to_the_same_parameters(cluster, reference, tmp_path):
    result, steps, victim = _run_with_fault(cluster, tmp_path, signal.SIGKILL)
    assert _same(result, reference)
    assert steps[-1] == STEPS - 1
    redone = len(steps) - len(set(steps))
    assert 0 < redone <= EVERY, f"{redone} steps computed twice (at most {EVERY} allowed)"
    assert cluster.slots[1].pid != victim
    assert_gone([victim])


def test_sigstop_hang_is_found_and_handled_like_a_death(cluster, reference, tmp_path):
    result, steps, victim = _run_with_fault(cluster, tmp_path, signal.SIGSTOP, at_step=8)
    assert _same(result, reference)
    assert steps[-1] == STEPS - 1
    assert_gone([victim])  # the stopped engine was killed, not left behind


def test_more_failures_than_restarts_is_a_clear_final_error(cluster, tmp_path):
    log = tmp_path / "steps.log"
    cluster.run(f"LOG = {str(log)!r}")
    # rank 1 dies on every attempt, before checkpointing anything
    crash = "import os\nif nbdist.rank() == 1:\n    os.kill(os.getpid(), 9)\n" + TRAIN
    with pytest.raises(DistributedCellError) as e:
        cluster.run(crash, CellOptions(restarts=1))
    text = e.value.report()
    assert "rank 1: engine process killed by SIGKILL" in text
    assert "gave up after 1 restart(s)" in text
    # the cluster is whole again afterwards
    assert (
        cluster.run("import torch\nt = torch.ones(1)\ntorch.distributed.all_reduce(t)\nt.item()")
        == 2.0
    )


def test_kill_during_a_checkpoint_write_never_loads_the_damaged_file(cluster, tmp_path):
    folder = tmp_path / "ck" / "t"  # run 't' under dir=tmp_path/ck
    cluster.run(
        "import torch\n"
        "big = {'w': torch.zeros(8)}\n"
        f"nbdist.checkpoint(1, dir={str(folder.parent)!r}, run='t', big=big)"
    )
    rank0 = cluster.slots[0].pid
    killed = threading.Event()

    def kill_mid_write():
        wait_until(lambda: list(folder.glob(".step-00000002*.tmp")), 60, 0.001, "the write")
        os.kill(rank0, signal.SIGKILL)
        killed.set()

    threading.Thread(target=kill_mid_write, daemon=True).start()
    with pytest.raises(DistributedCellError):  # 400 MB: long enough to be caught mid-write
        cluster.run(
            "big = {'w': torch.ones(100_000_000)}\n"
            f"nbdist.checkpoint(2, dir={str(folder.parent)!r}, run='t', big=big)",
            CellOptions(resume=True),
        )
    assert killed.is_set()
    assert not (folder / "step-00000002.json").exists()
    got = cluster.run(
        "import torch\nbig = {'w': torch.full((8,), 5.0)}\n"
        f"step = nbdist.restore(dir={str(folder.parent)!r}, run='t', big=big)\n"
        "(step, big['w'].sum().item())",
        CellOptions(resume=True),  # the same named run, continued in another cell
    )
    assert got == (2, 0.0)  # step 1's checkpoint, never the half-written step 2


def test_damaged_latest_checkpoint_falls_back(cluster, tmp_path):
    folder = tmp_path / "ck" / "t"
    ck = f"dir={str(folder.parent)!r}, run='t'"
    cluster.run(
        "import torch\nw = {'v': torch.zeros(2)}\n"
        f"for s in (3, 6):\n    w['v'] += 1\n    nbdist.checkpoint(s, {ck}, w=w)"
    )
    latest = folder / "step-00000006.pt"
    data = bytearray(latest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    latest.write_bytes(bytes(data))
    out = cluster.run(
        "import torch\nw = {'v': torch.zeros(2)}\n"
        f"step = nbdist.restore({ck}, w=w)\n"
        "(step, w['v'].tolist())",
        CellOptions(resume=True),
    )
    assert out == (4, [1.0, 1.0])


def test_checkpoints_are_kept_bounded_and_read_by_rank_0_only(cluster, tmp_path):
    folder = tmp_path / "only-rank0" / "t"
    # rank 1 is told a folder that does not exist: restore must not need it
    cluster.run(
        "import torch\nw = {'v': torch.zeros(1)}\n"
        f"d = {str(folder.parent)!r} if nbdist.rank() == 0 else '/nonexistent/nbdist'\n"
        "for s in range(6):\n    w['v'] += 1\n"
        "    nbdist.checkpoint(s, dir=d, run='t', keep=3, w=w)"
    )
    assert sorted(p.name for p in folder.glob("step-*.pt")) == [
        "step-00000003.pt",
        "step-00000004.pt",
        "step-00000005.pt",
    ]
    out = cluster.run(
        "w = {'v': torch.zeros(1)}\nnbdist.restore(dir=d, run='t', w=w), w['v'].item()",
        CellOptions(all_output=True, resume=True),
    )
    assert out == (6, 6.0)
    assert cluster.run("w['v'].item()", CellOptions(ranks=(1,))) == 6.0  # broadcast to rank 1


def test_unwritable_checkpoint_folder_fails_before_training(cluster):
    with pytest.raises(DistributedCellError) as e:
        cluster.run("nbdist.restore(dir='/proc/nbdist-checkpoints', w={})\nSTARTED = True")
    assert "checkpoint folder /proc/nbdist-checkpoints is not writable" in str(e.value)
    assert cluster.run("'STARTED' in globals()") is False


def test_restarts_need_every_rank(cluster):
    with pytest.raises(UsageError):
        cluster.run("1", CellOptions(restarts=1, ranks=(0,)))


def test_an_engine_that_died_between_cells_fails_the_next_cell_in_one_line(cluster):
    """The death is known before the cell is sent: no ipyparallel error from deep inside, and
    with --restarts the cell runs on a fresh engine as if nothing happened."""
    for restarts in (0, 1):
        victim = cluster.slots[1].pid
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda v=victim: v in cluster.drain_exits(), 10, what="the death to be known")
        code = "import torch\nimport torch.distributed as dist\nt = torch.ones(1)\n"
        code += "dist.all_reduce(t)\nt.item()"
        if restarts:
            assert cluster.run(code, CellOptions(restarts=1)) == 2.0
        else:
            with pytest.raises(DistributedCellError) as e:
                cluster.run(code)
            assert str(e.value).splitlines()[0].startswith("rank 1: engine process")
            assert "before the cell" in str(e.value)
            assert cluster.run(code) == 2.0  # repaired: a fresh engine took rank 1
        assert cluster.slots[1].pid != victim
        assert_gone([victim])


def test_a_busy_engine_ends_at_sigterm_not_after_its_cell(cluster, tmp_path):
    """A scheduler's SIGTERM (scancel, a time limit) ends a rank at once, mid-cell: the cell
    does not train on unseen (ipyparallel's own handler would wait for it to return)."""
    flag = tmp_path / "busy"
    victim = cluster.slots[1].pid

    def term_when_busy():
        wait_until(flag.exists, 30, what="rank 1 to be busy")
        os.kill(victim, signal.SIGTERM)

    threading.Thread(target=term_when_busy, daemon=True).start()
    cell = (
        "import pathlib, time\n"
        f"if nbdist.rank() == 1:\n    pathlib.Path({str(flag)!r}).touch()\n"
        "time.sleep(60)  # far longer than the test waits"
    )
    with pytest.raises(DistributedCellError) as e:
        cluster.run(cell, CellOptions(timeout=45))
    assert "rank 1: engine process exited with status 143" in str(e.value), str(e.value)
    assert_gone([victim])
    assert cluster.run("1 + 1") == 2  # repaired: a fresh engine took rank 1
