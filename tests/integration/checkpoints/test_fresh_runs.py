"""A new run starts afresh, on a real 2-engine cluster: a sweep or a cell run again under the
same name trains every step again (the earlier run's checkpoints move aside, said in one line)
unless ``--resume`` asks to continue; a run's own restarts still resume. Pruning counts only
checkpoints that verify; a ``dir=`` others may write is refused; an unsafe torch cannot load.
"""

from __future__ import annotations

import grp
import io
import os
import stat

import pytest
import torch

from nbdist.errors import DistributedCellError, UsageError
from nbdist.notebook.sweeps.trials import pull_trial, sweep
from nbdist.worker.checkpoint import files

TRIAL = """
import torch
model = torch.nn.Linear(2, 1)
done = []
for step in nbdist.steps(6, every=2, m=model):
    done.append(step)
    nbdist.report(step=step, loss=lr)
"""


def _checkpoints(data_dir, name: str) -> list[str]:
    folder = data_dir / "checkpoints"
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(name))


def test_a_sweep_run_again_under_its_name_trains_afresh_unless_resumed(
    cluster, nbdist_data_dir, capsys
):
    params = {"lr": [0.1, 0.01]}
    first = sweep(TRIAL, params, trial_size=1, name="same", board=False)
    assert [r.state for r in first] == ["done", "done"]
    assert pull_trial("done", "best") == [0, 1, 2, 3, 4, 5]
    capsys.readouterr()

    again = sweep(TRIAL, params, trial_size=1, name="same", board=False)
    assert [r.state for r in again] == ["done", "done"]
    assert pull_trial("done", "best") == [0, 1, 2, 3, 4, 5]  # every step trained again
    assert [r.step for r in again] == [5, 5]
    said = capsys.readouterr().out
    assert "run 'same-0' already had checkpoints (6 steps done) from an earlier run" in said
    assert "run the cell again with --resume" in said
    names = _checkpoints(nbdist_data_dir, "same-")
    assert len(names) == 4 and {"same-0", "same-1"} <= set(names)  # the earlier two, aside
    aside = [n for n in names if ".earlier-" in n]
    assert sorted(n.split(".")[0] for n in aside) == ["same-0", "same-1"]
    kept = nbdist_data_dir / "checkpoints" / aside[0]
    assert any(p.name.startswith("step-") for p in kept.iterdir())

    resumed = sweep(TRIAL, params, trial_size=1, name="same", board=False, resume=True)
    assert [r.state for r in resumed] == ["done", "done"]
    assert [r.step for r in resumed] == [None, None]  # finished runs resume as finished
    assert _checkpoints(nbdist_data_dir, "same-") == names  # nothing moved this time


CELL = """
import torch
model = torch.nn.Linear(2, 1)
done = []
for step in nbdist.steps(4, every=1, run="exp1", m=model):
    done.append(step)
done
"""


def test_a_named_cell_run_again_starts_afresh_and_resumes_when_asked(cluster, capsys):
    from nbdist.config import CellOptions

    assert cluster.run(CELL) == [0, 1, 2, 3]
    assert cluster.run(CELL) == [0, 1, 2, 3]
    assert "run 'exp1' already had checkpoints (4 steps done)" in capsys.readouterr().out
    stopped = CELL.replace("done.append(step)", "done.append(step)\n    if step == 1: break")
    assert cluster.run(stopped) == [0, 1]  # afresh, and stopped after 2 steps
    opts = CellOptions(resume=True)
    assert cluster.run(CELL, opts=opts) == [1, 2, 3]  # continues that run (step 1 broke off)
    with pytest.raises(UsageError, match="resume must be True or False"):
        CellOptions(resume="yes")


def test_pruning_keeps_the_newest_that_verify(tmp_path):
    for step in range(5):
        buf = io.BytesIO()
        torch.save({"format": files.FORMAT, "step": step}, buf)
        files.write(tmp_path, step, buf.getvalue())
    for step in (3, 4):  # the two newest rot on disk
        path = tmp_path / f"{files.stem(step)}.pt"
        path.write_bytes(b"\0" * path.stat().st_size)
        os.utime(path, ns=(1, 1))
    files.prune(tmp_path, keep=2)
    left = sorted(int(p.stem.split("-")[1]) for p in tmp_path.glob("step-*.pt"))
    assert left == [1, 2, 3, 4]  # 1 and 2 verify; the rotten ones are not counted
    payload, skipped = files.load_latest(tmp_path)
    assert payload["step"] == 2 and [s.split(":")[0] for s in skipped] == [
        "step-00000004.pt",
        "step-00000003.pt",
    ]


def _shared_group(path) -> None:
    """``path``'s group one that others are in (staff): a user's private group, named after
    them with no one else in it, would make group-writable theirs alone (``paths``)."""
    if os.geteuid() != 0:
        pytest.skip("chown to a shared group needs root")
    os.chown(path, -1, grp.getgrnam("staff").gr_gid)


def test_a_checkpoint_dir_others_may_write_is_refused(cluster, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(DistributedCellError, match="can be written by other users .mode 777."):
        cluster.run(f"nbdist.restore(dir={str(shared)!r}, run='r', w={{}})")
    shared.chmod(0o777 | stat.S_ISVTX)  # like /tmp: others cannot move what is ours
    assert cluster.run(f"nbdist.restore(dir={str(shared)!r}, run='r', w={{}})") == 0
    (shared / "r").chmod(0o770)
    _shared_group(shared / "r")
    with pytest.raises(DistributedCellError, match=r"shared/r can be written by other users"):
        cluster.run(f"nbdist.restore(dir={str(shared)!r}, run='r', w={{}})")


def test_a_torch_whose_safe_loader_has_known_bypasses_loads_no_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "SAFE_TORCH", "99.0")
    with pytest.raises(UsageError, match=r"CVE-2025-32434\): upgrade to torch>=99.0"):
        files.load_latest(tmp_path)
