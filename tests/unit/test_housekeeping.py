"""The retention rule on a real data folder: real files, real PIDs (this process alive, an exited
child's dead), the real run store; what the plan lists, what ``free`` removes, what stays."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from processes import wait_until

import nbdist
from nbdist.config import Retention
from nbdist.errors import UsageError
from nbdist.notebook.cluster.engines import logs
from nbdist.notebook.housekeeping import census, gc, inuse, plan
from nbdist.telemetry.store import RunStore

DAY = 86400.0


@pytest.fixture
def root(tmp_path, monkeypatch):
    """A fresh data folder of this test's own (``$NBDIST_DATA_DIR``), no status line kept."""
    path = tmp_path / "data"
    path.mkdir(mode=0o700)
    monkeypatch.setenv("NBDIST_DATA_DIR", str(path))
    monkeypatch.setattr(gc, "_status", None)
    return path


def put(path: Path, size: int = 100, age: float = 30 * DAY, data: bytes | None = None) -> Path:
    """A file of ``size`` bytes (or ``data``), last written ``age`` seconds ago."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if data is not None else b"x" * size)
    aged(path, age)
    return path


def aged(path: Path, age: float) -> Path:
    t = time.time() - age
    os.utime(path, (t, t))
    return path


def checkpoints(root: Path, key: str, age: float, size: int = 1000) -> Path:
    folder = root / "checkpoints" / key
    put(folder / "step-00000001.pt", size, age)
    put(folder / "step-00000001.json", 10, age)
    return aged(folder, age)


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def cluster_files(root: Path, cid: str, pid: int, age: float = DAY) -> list[Path]:
    """What a cluster leaves in the profile: its cluster file (naming its controller's pid),
    connection files, hub state and a log folder with an engine's log."""
    sec, log = root / "profile" / "security", root / "profile" / "log"
    record = {"cluster": {"cluster_id": cid}, "controller": {"state": {"pid": pid}}}
    return [
        put(sec / f"cluster-{cid}.json", data=json.dumps(record).encode(), age=age),
        put(sec / f"ipcontroller-{cid}-client.json", age=age),
        put(sec / f"ipcontroller-{cid}-engine.json", age=age),
        put(log / f"engines{cid}.json", age=age),
        put(log / f"ipcontroller-{cid}-{pid}.log", age=age),
        aged(put(log / cid / "engine-1.log", age=age).parent, age),
    ]


def test_the_rule_is_checked_where_it_is_built():
    r = Retention()
    assert (r.keep_checkpoints, r.keep_runs, r.keep_days, r.keep_logs) == (10, 100, 14.0, 10)
    assert r.log_bytes == 10 * 2**20
    with pytest.raises(UsageError, match="keep_checkpoints must be a whole number >= 0"):
        Retention(keep_checkpoints=-1)
    with pytest.raises(UsageError, match="keep_days must be a number of days >= 0"):
        Retention(keep_days=float("nan"))
    with pytest.raises(UsageError, match="there is no setting 'keep_checkpoint': the rule's"):
        nbdist.gc(keep_checkpoint=3)
    with pytest.raises(UsageError, match="dry_run must be True or False"):
        nbdist.gc(dry_run="no")


def test_old_checkpoints_are_planned_shown_and_freed_only_when_asked(root):
    for age in range(1, 13):  # 12 runs' folders, 1 to 12 days old
        checkpoints(root, f"nbdist-0000000{age % 10}-{age:08x}", age * DAY)
    earlier = checkpoints(root, "exp1.earlier-20250101-120000", 0.5 * DAY)  # set aside
    leftover = checkpoints(root, ".gc-nbdist-00000000-00000099", 40 * DAY)  # a gc cut short
    p = nbdist.gc(keep_checkpoints=10)
    planned = sorted(i.path.name for i in p.items if i.kind == "checkpoints")
    oldest = ["nbdist-00000000-0000000a", "nbdist-00000001-0000000b", "nbdist-00000002-0000000c"]
    assert planned == [leftover.name, *oldest]  # the 10 newest stay, the earlier one among them
    assert p.bytes("checkpoints") == 4 * 1010
    assert "the rule frees 4.0 kB" in str(p) and "%nbdist gc --yes frees it" in str(p)
    assert len(list((root / "checkpoints").iterdir())) == 14  # a plan removes nothing
    p.free()
    assert p.freed == 4 * 1010 and not p.failed
    left = sorted(f.name for f in (root / "checkpoints").iterdir())
    assert len(left) == 10 and earlier.name in left and not set(planned) & set(left)
    assert nbdist.gc(keep_checkpoints=10).items == []  # nothing more to free
    p = nbdist.gc(dry_run=False, keep_checkpoints=0)  # the earlier run's folder goes like any
    assert len(p.items) == 10 and not list((root / "checkpoints").iterdir())


def test_checkpoints_in_use_stay_whatever_their_age(root):
    now = time.time()
    for key, age in [
        ("nbdist-live0001-aaaa1111", 30 * DAY),  # a cell's run on a running cluster
        ("sweep-1-3", 30 * DAY),  # a running sweep's trial
        ("exp1", 0.5 * DAY),  # named by the person, written since a running cluster started
        ("exp1.earlier-20250101-120000", 0.5 * DAY),  # set aside: never in use
        ("new", 10.0),  # written seconds ago
        ("old", 30 * DAY),
    ]:
        checkpoints(root, key, age)
    use = inuse.InUse(
        clusters=frozenset({"nbdist-live0001"}),
        keys=frozenset({"sweep-1-3"}),
        since=now - DAY,
        now=now,
    )
    p = plan.make(census.take(root), use, [], Retention(keep_checkpoints=0))
    assert sorted(i.what for i in p.items) == ["exp1.earlier-20250101-120000", "old"]
    assert sum(p.kept.values()) == 4
    assert "kept: 1 older checkpoint folder(s) in use (of a running cluster)" in str(p)


def test_a_dead_kernels_cluster_files_go_and_a_live_ones_stay(root):
    dead, live = "nbdist-dead0001", "nbdist-live0001"
    dead_files = cluster_files(root, dead, dead_pid())
    live_files = cluster_files(root, live, os.getpid())  # this process: a running controller
    host = subprocess.Popen(  # a live cluster host, as registry.host_alive knows one
        [sys.executable, "-c", "import sys; sys.stdin.read()", "nbdist.host"],
        stdin=subprocess.PIPE,
    )
    try:
        gone_host, live_host = dead_pid(), host.pid
        for pid in (gone_host, live_host):
            for suffix in ("json", "sock", "lease"):
                put(root / "clusters" / f"host-{pid}.{suffix}", age=DAY)
        use = inuse.look(root, runs=None)
        assert use.clusters == {live} and use.hosts == {live_host}
        p = nbdist.gc(keep_logs=0)
        assert {i.path for i in p.items if i.path} == set(dead_files)
        assert [i.host for i in p.items if i.host] == [gone_host]
        p.free()
        assert not any(f.exists() for f in dead_files), p
        assert all(f.exists() for f in live_files)
        names = sorted(f.name for f in (root / "clusters").iterdir())
        assert names == [f"host-{live_host}.{s}" for s in ("json", "lease", "sock")]
    finally:
        host.stdin.close()
        host.wait(timeout=10)


def test_free_looks_again_and_spares_what_came_into_use(root):
    cid = "nbdist-back0001"
    files = cluster_files(root, cid, dead_pid())
    p = nbdist.gc(keep_logs=0)
    assert len(p.items) == len(files)
    record = {"cluster": {"cluster_id": cid}, "controller": {"state": {"pid": os.getpid()}}}
    put(files[0], data=json.dumps(record).encode(), age=DAY)  # its controller runs again
    p.free()
    assert p.freed == 0 and len(p.spared) == len(files)
    assert all(f.exists() for f in files) and "kept 6 item(s) in use by then" in p.outcome()


def test_runs_beyond_the_rule_leave_the_store_through_its_own_api(root):
    store = RunStore()
    now = time.time()
    running = store.start_run(name="long", started=now - 50 * DAY)
    store.touch(running)  # its writer is alive: running, however old
    ids = [store.start_run(name=f"r{i}", started=now - (40 - i) * DAY) for i in range(5)]
    for i in ids:
        store.add_metrics(i, [{"time": now, "rank": 0, "step": 1, "loss": 0.5}])
        store.end_run(i, "ok")
    recent = store.start_run(name="recent", started=now - DAY)
    store.end_run(recent, "ok")
    aged(put(root / "runs" / str(ids[0]) / "trace.json", 500).parent, DAY)
    orphan = aged(put(root / "runs" / "999" / "trace.json", 700).parent, DAY)  # its run is gone
    p = nbdist.gc(keep_runs=2, keep_days=14)
    planned = [i.run_id for i in p.items if i.run_id is not None]
    assert sorted(planned) == ids[:4]  # not the newest 2 (recent, r4), nor the running one
    assert {i.path for i in p.items if i.path} == {root / "runs" / str(ids[0]), orphan}
    assert "kept: 1 old run(s) still running" in str(p) and "of runs.sqlite" in str(p)
    p.free()
    assert sorted(r["id"] for r in store.list_runs()) == sorted([ids[4], running, recent])
    assert store.get_run(ids[0]) is None and store.metrics(ids[0]) == []
    assert not (root / "runs" / str(ids[0])).exists() and not orphan.exists()
    with sqlite3.connect(store.path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert store.start_run(name="after") > recent  # the store goes on


def test_a_log_over_the_cap_rotates_and_its_writer_goes_on(tmp_path):
    log = tmp_path / "engine-1.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # as the fork server
    try:
        first = bytes(range(256)) * 400  # 100 kB
        os.write(fd, first)
        assert logs.rotate(log, 8192) == len(first) - 8192
        assert log.stat().st_size == 0
        assert logs.rotated(log).read_bytes() == first[-8192:]
        assert logs.rotated(log).stat().st_mode & 0o777 == 0o600
        os.write(fd, b"after the rotation\n")  # appends at the new end: no hole, no restart
        assert log.read_bytes() == b"after the rotation\n"
        assert logs.rotate(log, 8192) == 0  # under the cap: left alone
    finally:
        os.close(fd)


def test_a_running_clusters_logs_are_capped_as_they_grow(tmp_path):
    log = tmp_path / "engine-1.log"
    cap = logs.LogCap(lambda: logs.cluster_logs(tmp_path), limit=4096, every=0.02).start()
    try:
        with open(log, "ab") as f:
            f.write(b"y" * 50_000)
        wait_until(lambda: logs.rotated(log).exists(), 10, what="the log to be rotated")
        assert log.stat().st_size < 4096 and logs.rotated(log).stat().st_size == 4096
    finally:
        cap.stop()


def test_the_census_walk_is_bounded_and_the_status_line_says_so(root):
    for age in range(1, 13):
        checkpoints(root, f"run-{age}", age * DAY, size=10_000)
    full = census.take(root)
    assert full.complete and full.sizes["checkpoints"] == 12 * 10_010
    cut = census.take(root, limit=10)
    assert not cut.complete and cut.total < full.total
    line = gc.status_line()
    assert line == (f"data folder {root}: 120 kB (checkpoints 120 kB); %nbdist gc frees 20 kB"), (
        line
    )
    put(root / "checkpoints" / "run-0" / "big.pt", 10**6, DAY)
    assert gc.status_line() == line  # kept a while: status runs often
    nbdist.gc(dry_run=False)  # freeing measures again
    assert gc.status_line().startswith(f"data folder {root}: 1.1 MB (checkpoints 1.1 MB)")


def test_no_data_folder_yet_is_nothing_to_free(root, monkeypatch):
    monkeypatch.setenv("NBDIST_DATA_DIR", str(root / "not-yet"))
    p = nbdist.gc()
    assert p.items == [] and "nothing to free" in str(p)
    assert not (root / "not-yet").exists()  # a look creates nothing
