"""A tracker is sent a run's own checkpoints or none (issue 46, item 6): the folder a run's last
checkpoint event names may since hold a later run's checkpoints (a run under the same name moved
the earlier ones aside) and the temporary files of a write in progress.

Real runs on a real 2-engine cluster write the checkpoints and the run store; MLflow (a local
file store) receives them; W&B and Comet (offline) are refused before anything is made.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
from clusters import watched

from nbdist.config import CellOptions
from nbdist.errors import UsageError
from nbdist.notebook.board.runs import Run
from nbdist.telemetry.store import RunStore
from nbdist.worker.checkpoint import files, owner, snapshot

CELL = """
import torch
net = torch.nn.Linear(3, 2)
with torch.no_grad():
    net.weight.fill_({value})
for step in range(2):
    nbdist.checkpoint(step, model=net, dir={dir!r}, run="exp")
"""


def _run(cluster, dir: Path, value: float) -> Run:
    """A real run that checkpoints into ``dir/exp``, as the store keeps it."""
    store, src, opts = RunStore(), CELL.format(value=value, dir=str(dir)), CellOptions()
    mon = watched(cluster, src, opts, store_at=store)
    cluster.run(src, opts, watch=mon)
    return Run(store.get_run(mon.run_id), store)


@pytest.fixture
def trackers(tmp_path, monkeypatch):
    """Every tracker writing under ``tmp_path``: MLflow's file store, W&B and Comet offline."""
    env = {
        "MLFLOW_TRACKING_URI": f"file:{tmp_path / 'mlruns'}",
        "MLFLOW_ALLOW_FILE_STORE": "true",
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path / "wandb"),
        "COMET_START_ONLINE": "false",
        "COMET_OFFLINE_DIRECTORY": str(tmp_path / "comet"),
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for k in ("MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID"):
        monkeypatch.delenv(k, raising=False)
    return tmp_path


def _mlflow_runs() -> list:
    from mlflow.tracking import MlflowClient

    return MlflowClient().search_runs(["0"])


def test_a_run_whose_folder_a_later_run_took_sends_no_checkpoints(cluster, trackers, tmp_path):
    pytest.importorskip("mlflow")
    first = _run(cluster, tmp_path / "ckpts", 1.0)
    later = _run(cluster, tmp_path / "ckpts", 2.0)  # the same name: the first's move aside
    folder = tmp_path / "ckpts" / "exp"
    (aside,) = (tmp_path / "ckpts").glob("exp.earlier-*")
    ours = json.loads((aside / "run.json").read_text())["run"]
    theirs = json.loads((folder / "run.json").read_text())["run"]
    assert ours != theirs
    here = f"{socket.gethostname()}.{os.getpid()}"  # a write in progress, by a live process
    (folder / f".step-00000002.pt.{here}.tmp").write_bytes(b"half a model")
    (folder / f".step-00000002.dcp.{here}.tmp").mkdir()
    (folder / f".step-00000002.dcp.{here}.tmp" / "__0_0.distcp").write_bytes(b"a shard")
    (folder / "step-00000003.pt").write_bytes(b"written, not yet marked")
    said = (
        f"run {first.id}'s checkpoint folder {folder} now holds another run's checkpoints (its "
        f"run record names run {theirs!r}); run {first.id}'s own moved to {aside}: send the "
        "run without checkpoints=True"
    )
    for send in (first.to_mlflow, first.to_wandb, first.to_comet):
        with pytest.raises(UsageError) as e:
            send(checkpoints=True)
        assert str(e.value) == said
    assert _mlflow_runs() == []  # refused before any tracker run was made
    assert not (tmp_path / "wandb").exists() and not (tmp_path / "comet").exists()

    sent = later.to_mlflow(checkpoints=True)
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    got = sorted(a.path.split("/", 1)[1] for a in client.list_artifacts(sent, "checkpoints"))
    done = ["step-00000000.json", "step-00000000.pt", "step-00000001.json", "step-00000001.pt"]
    assert got == sorted(["run.json", *done])  # no temporary file, nothing unmarked
    local = Path(client.download_artifacts(sent, "checkpoints/step-00000001.pt", str(tmp_path)))
    assert local.read_bytes() == (folder / "step-00000001.pt").read_bytes()
    assert sorted(p.name for p in folder.glob(".upload*")) == []  # the snapshot is gone


# -- the snapshot itself: what a rename or a claim meanwhile does ------------------------------


def _folder_of(tmp_path: Path, run_id: str) -> Path:
    """A run's folder as rank 0 leaves it: claimed, two checkpoints written."""
    folder = tmp_path / "exp"
    folder.mkdir(mode=0o700)
    owner.claim(folder, run_id, resume=False)
    for step in (0, 1):
        files.write(folder, step, b"model %d" % step)
    return folder


def _refused(folder: Path) -> str:
    """The line refusing to pin run-a's ``folder``; nothing is left behind."""
    with pytest.raises(UsageError) as e:
        with snapshot.pinned(folder, "run-a", 7):
            pytest.fail("a snapshot of what should be refused")
    assert [p.name for p in folder.glob(".upload*")] == []
    return str(e.value)


def test_a_snapshot_outlives_its_folder_moving_aside(tmp_path):
    folder = _folder_of(tmp_path, "run-a")
    with snapshot.pinned(folder, "run-a", 7) as pinned:
        assert pinned.name == "exp"  # a tracker names the files as in the run's folder
        owner.claim(folder.parent / "exp", "run-b", resume=False)  # moves it aside, new folder
        files.write(folder, 0, b"the later run's model")
        assert (pinned / "step-00000000.pt").read_bytes() == b"model 0"
        assert sorted(p.name for p in pinned.iterdir()) == [
            "run.json",
            "step-00000000.json",
            "step-00000000.pt",
            "step-00000001.json",
            "step-00000001.pt",
        ]
    (aside,) = tmp_path.glob("exp.earlier-*")
    assert [p.name for p in aside.glob(".upload*")] == []  # removed where it went


def test_a_folder_claimed_while_it_is_read_is_refused(tmp_path, monkeypatch):
    folder = _folder_of(tmp_path, "run-a")
    marked = files.marked

    def claimed_meanwhile(names):  # as the snapshot lists the folder
        monkeypatch.setattr(files, "marked", marked)
        owner.claim(folder, "run-c", resume=True)  # a later run resumes it in place
        return marked(names)

    monkeypatch.setattr(files, "marked", claimed_meanwhile)
    assert _refused(folder) == (
        f"run 7's checkpoint folder {folder} now holds another run's checkpoints (its run "
        "record names run 'run-c'): send the run without checkpoints=True"
    )


def test_a_link_among_the_checkpoints_is_never_sent(tmp_path):
    folder = _folder_of(tmp_path, "run-a")
    secret = tmp_path / "secret"
    secret.write_bytes(b"not a checkpoint")
    (folder / "step-00000001.pt").unlink()
    (folder / "step-00000001.pt").symlink_to(secret)
    assert _refused(folder) == (
        f"{folder / 'step-00000001.pt'} is not a plain file (a link?), which no checkpoint "
        "holds: refused to send it; delete that checkpoint, or send the run without "
        "checkpoints=True"
    )


def test_a_snapshot_a_killed_kernel_left_is_pruned(tmp_path):
    folder = _folder_of(tmp_path, "run-a")
    gone = subprocess.Popen(["true"])
    gone.wait()  # a process that has exited: its snapshot is litter
    host = socket.gethostname()
    left, live = (folder / f".upload.{host}.{pid}.tmp" for pid in (gone.pid, os.getpid()))
    for d in (left, live):
        (d / "exp").mkdir(parents=True)
        os.link(folder / "step-00000000.pt", d / "exp" / "step-00000000.pt")
    files.prune(folder, keep=2)
    assert not left.exists() and (live / "exp" / "step-00000000.pt").exists()
