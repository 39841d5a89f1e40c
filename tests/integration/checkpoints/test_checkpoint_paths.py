"""A checkpoint stays inside its folder, and its folder is ours: a sharded checkpoint whose
metadata points elsewhere is refused (issue 46, item 5), the run's folder is checked as it is
made (a folder another user slips in first is refused), and what the loader remembers of
verified files stays bounded over many steps and folders (item 7).

Real files, real ``torch.distributed.checkpoint``, in a one-rank gloo group of this process:
the sharded checkpoints are written and loaded by ``sharded.save`` and ``sharded.load``, as a
cell's ranks would.
"""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pickle
import warnings
from pathlib import Path

import pytest
import torch

from nbdist.errors import UsageError
from nbdist.worker.checkpoint import contents, files, folders, sharded, storage

STEP1 = "step-00000001.dcp"


@pytest.fixture
def one_rank():
    """A one-rank gloo group in this process, destroyed afterwards."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DCP's notes on a one-rank world
            yield
    finally:
        dist.destroy_process_group()


def _net(value: float) -> torch.nn.Linear:
    net = torch.nn.Linear(2, 1)
    with torch.no_grad():
        for p in net.parameters():
            p.fill_(value)
    return net


def _save(folder: Path, step: int, value: float) -> None:
    """A real sharded checkpoint of a model whose weights are ``value``, keeping two."""
    record = {"rng": {}, "generators": {}, "stage": None}
    state = {"model": _net(value)}
    sharded.save(step, lambda: folders.prepare(folder), 2, state, record)


def _found(folder: Path, step: int) -> dict:
    """What ``files.load_latest`` hands every rank for the checkpoint of ``step``, as a rank
    that does not verify it (or one it changed under) sees it."""
    marker = json.loads((folder / f"{files.stem(step)}.json").read_text())
    return {
        "format": "dcp",
        "step": step,
        "path": str(folder / f"{files.stem(step)}.dcp"),
        **marker,
    }


def _loaded(found: dict) -> float:
    net = _net(0.0)
    sharded.load(found, {"model": net}, {})
    return float(net.weight.flatten()[0])


def _point_at(step: Path, target: str) -> None:
    """``step``'s metadata rewritten so every item is read from ``target``, and its marker
    rewritten to match: it verifies."""
    md = contents.load_metadata(step / ".metadata")
    for info in md.storage_data.values():
        info.relative_path = target
    data = pickle.dumps(md)
    (step / ".metadata").write_bytes(data)
    mark = step.with_suffix(".json")
    marker = json.loads(mark.read_text())
    marker["files"][".metadata"] = [len(data), hashlib.sha256(data).hexdigest()]
    mark.write_text(json.dumps(marker))


@pytest.mark.parametrize("how", ["dotdot", "absolute"])
def test_metadata_pointing_outside_its_folder_loads_nothing_from_there(one_rank, tmp_path, how):
    run, other = tmp_path / "run", tmp_path / "other"
    _save(run, 0, 1.0)
    _save(run, 1, 2.0)
    _save(other, 1, 7.0)  # another run's checkpoint, which the rewritten metadata points at
    theirs = other / STEP1 / "__0_0.distcp"
    target = {"dotdot": f"../../other/{STEP1}/__0_0.distcp", "absolute": str(theirs)}[how]
    _point_at(run / STEP1, target)
    said = (
        f"{run / STEP1 / '.metadata'} points at {target!r}, outside its checkpoint folder: "
        "refused to load it (it could load another checkpoint's data); delete that checkpoint"
    )
    found, skipped = files.load_latest(run)  # rank 0: the bad one skipped, the older loads
    assert (found["step"], skipped) == (0, [f"{STEP1}: {said[:300]}"])  # a long one: cut
    assert _loaded(found) == 1.0
    with pytest.raises(UsageError) as e:  # a rank that reads it all the same
        _loaded(_found(run, 1))
    assert str(e.value) == said


def test_a_shard_that_is_a_link_out_of_its_folder_is_never_read(one_rank, tmp_path):
    run, other = tmp_path / "run", tmp_path / "other"
    _save(run, 1, 2.0)
    _save(other, 1, 7.0)
    shard = run / STEP1 / "__0_0.distcp"
    shard.unlink()
    shard.symlink_to(other / STEP1 / "__0_0.distcp")
    found, skipped = files.load_latest(run)
    assert found is None and skipped == [f"{STEP1}: checksum mismatch in __0_0.distcp"]
    with pytest.raises(UsageError) as e:
        _loaded(_found(run, 1))
    assert str(e.value) == (
        f"{run / STEP1 / '.metadata'} points at '__0_0.distcp', a link, which may lead outside "
        "its checkpoint folder: refused to load it (it could load another checkpoint's data); "
        "delete that checkpoint"
    )
    with pytest.raises(OSError) as e:  # a link swapped in after the check: not followed
        with storage.SafeReader(run / STEP1).fs.create_stream(shard, "rb"):
            pass
    assert e.value.errno == 40  # ELOOP


# -- the run's folder: its creation is the check --------------------------------------------


def _theirs(path: Path, mode: int = 0o777) -> None:
    """``path`` made by another user (nobody), as they would in a shared sticky folder."""
    path.mkdir(mode=mode)
    path.chmod(mode)
    os.chown(path, 65534, 65534)


@pytest.fixture
def shared(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("making another user's folder needs root")
    where = tmp_path / "shared"
    where.mkdir()
    where.chmod(0o1777)  # like /tmp: anyone may make a folder in it
    return where


def test_a_run_folder_another_user_makes_first_is_refused(shared):
    folder = folders.run_folder(shared, "r")  # checked: nothing there yet
    _theirs(folder)  # slipped in between the check and the mkdir
    with pytest.raises(UsageError) as e:
        folders.prepare(folder)
    assert str(e.value) == (
        f"checkpoint folder {folder} belongs to another user (uid 65534), who could plant "
        "checkpoints there: pass dir= a folder of your own (chmod go-w, or mkdir -m 700)"
    )
    deeper = folders.run_folder(shared / "mine" / "ckpts", "r")  # its parents made too
    _theirs(shared / "mine")
    with pytest.raises(UsageError, match=f"^checkpoint folder {shared / 'mine'} belongs to"):
        folders.prepare(deeper)
    assert not (shared / "mine" / "ckpts").exists()


def test_a_link_in_the_run_folders_place_is_refused(shared, tmp_path):
    mine = tmp_path / "elsewhere"
    mine.mkdir(mode=0o700)
    folder = folders.run_folder(shared, "r")
    folder.symlink_to(mine)
    with pytest.raises(UsageError) as e:
        folders.prepare(folder)
    assert str(e.value) == (
        f"checkpoint folder {folder} is a link, which could lead to a folder someone else "
        "chose: pass dir= a folder of your own (chmod go-w, or mkdir -m 700)"
    )
    assert list(mine.iterdir()) == []


def test_a_folder_where_nothing_can_be_made_is_one_line():
    with pytest.raises(UsageError) as e:
        folders.prepare(Path("/proc/nbdist-checkpoints/r"))
    assert str(e.value) == (
        "checkpoint folder /proc/nbdist-checkpoints is not writable (No such file or directory): "
        "pass dir= a folder you can write, or set NBDIST_DATA_DIR"
    )


def test_a_run_folder_made_meanwhile_by_this_user_is_taken(shared):
    folder = folders.run_folder(shared, "r")
    folder.mkdir(mode=0o700)  # another rank of this run, on this host, was first
    assert folders.prepare(folder) == folder
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    folder.chmod(0o770)
    if os.geteuid() == 0:  # a shared group: the user's private one would make 770 theirs alone
        os.chown(folder, -1, grp.getgrnam("staff").gr_gid)
    else:
        return
    with pytest.raises(UsageError, match="can be written by other users .mode 770."):
        folders.prepare(folder)


# -- what verification remembers: bounded over a long night -----------------------------------


def _remembered() -> int:
    return sum(len(known) for known in files._verified.values())


def test_what_is_remembered_of_verified_files_stays_bounded(one_rank, tmp_path, monkeypatch):
    files._verified.clear()
    for step in range(40):  # a long run: keep 2, every checkpoint one shard and its metadata
        _save(tmp_path / "long", step, float(step))
    assert _remembered() == 2 * 2  # the two kept checkpoints' files, not forty's
    for n in range(40):  # many runs, each its own folder
        _save(tmp_path / f"run{n}", 0, 1.0)
    assert (len(files._verified), _remembered()) == (16, 16 * 2)  # the folders used last
    hashed = []
    digest = files.digest
    monkeypatch.setattr(files, "digest", lambda p: hashed.append(p.name) or digest(p))
    _save(tmp_path / "run39", 1, 2.0)  # hashed as written; its prune hashes nothing again
    assert sorted(hashed) == [".metadata", "__0_0.distcp"]
    hashed.clear()
    (tmp_path / "run39" / "step-00000001.dcp" / "__0_0.distcp").touch()  # changed: hashed again
    files.prune(tmp_path / "run39", keep=2)
    assert hashed == ["__0_0.distcp"]
