"""The run store: rows in, the same rows out, safely, while another process reads."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sqlite3
import stat
import subprocess
import sys
import threading
import time

import pytest
from processes import wait_until

from nbdist.errors import UsageError
from nbdist.telemetry.database import default_path
from nbdist.telemetry.events import HEALTH_COLUMNS, MetricRecord, RunEvent, WorkerHealth
from nbdist.telemetry.store import RunStore
from nbdist.telemetry.writer import StoreWriter


def _fill(s: RunStore) -> int:
    rid = s.start_run(
        name="mlp",
        source="train()",
        options={"total": 10, "lr": 0.1},
        cluster_id="c1",
        world_size=2,
        total=10,
    )
    now = time.time()
    s.add_metrics(
        rid,
        [
            {"time": now, "rank": 0, "step": 0, "loss": 2.5, "samples": 32, "extra": {"lr": 0.1}},
            {"time": now, "rank": 1, "step": 0, "loss": float("nan"), "samples": 32},
            {"time": now, "rank": 1, "step": 1, "loss": float("-inf"), "samples": None},
        ],
    )
    s.put_health(
        rid,
        [
            {
                "rank": 0,
                "time": now,
                "host": "h0",
                "state": "ok",
                "cpu": 50.0,
                "rss": 1e8,
                "step_time": 0.1,
                "last_report_age": 0.2,
            },
            {"rank": 1, "time": now, "host": "h1", "state": "slow", "cpu": float("nan")},
        ],
    )
    s.put_health(rid, [{"rank": 1, "time": now + 1, "host": "h1", "state": "dead"}])
    s.add_event(rid, "nan", rank=1, message="loss is nan at step 0", data={"step": 0})
    s.add_event(rid, "died", rank=1, message="<b>engine</b> gone")
    return rid


def test_rows_come_back_as_json_safe_plain_data(tmp_path):
    s = RunStore(tmp_path / "runs.sqlite")
    rid = _fill(s)
    s.update_run(rid, step=2, loss=float("nan"), samples_per_s=640.0)
    s.end_run(rid, "failed", failures=[{"rank": 1, "summary": "boom", "kind": "died"}])

    [run] = s.list_runs()
    assert (run["id"], run["name"], run["status"], run["world_size"]) == (rid, "mlp", "failed", 2)
    assert (run["step"], run["total"], run["loss"], run["nonfinite"]) == (2, 10, None, "nan")
    assert run["cluster_id"] == "c1" and run["samples_per_s"] == 640.0
    assert run["ended"] >= run["started"]
    full = s.get_run(rid)
    assert full["source"] == "train()" and full["options"] == {"total": 10, "lr": 0.1}
    assert full["failures"] == [{"rank": 1, "summary": "boom", "kind": "died"}]
    assert s.get_run(rid + 1) is None

    m = s.metrics(rid)
    assert [(r["rank"], r["step"], r["loss"], r["nonfinite"]) for r in m] == [
        (0, 0, 2.5, None),
        (1, 0, None, "nan"),
        (1, 1, None, "-inf"),
    ]
    assert m[0]["extra"] == {"lr": 0.1} and m[1]["extra"] == {}
    assert s.metrics(rid, since_id=m[1]["id"]) == m[2:]

    h = s.health(rid)
    assert [(r["rank"], r["host"], r["state"]) for r in h] == [(0, "h0", "ok"), (1, "h1", "dead")]
    assert h[0]["cpu"] == 50.0 and h[0]["last_report_age"] == 0.2
    assert len(s.health_history(rid)) == 3

    ev = s.events(rid)
    assert [(e["kind"], e["rank"]) for e in ev] == [("nan", 1), ("died", 1)]
    assert ev[1]["message"] == "<b>engine</b> gone"  # stored as text; escaping is the viewer's job
    assert ev[0]["data"] == {"step": 0}
    import json

    json.dumps([run, full, m, h, ev], allow_nan=False)  # the sidebar can send every row as is


def test_default_location_is_private_and_under_data_dir(nbdist_data_dir):
    assert default_path() == nbdist_data_dir / "runs.sqlite"
    s = RunStore()
    s.start_run(name="x")
    mode = stat.S_IMODE(os.stat(default_path()).st_mode)
    assert mode == 0o600, oct(mode)
    with sqlite3.connect(default_path()) as c:
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_reading_a_store_that_does_not_exist_creates_nothing(tmp_path):
    s = RunStore(tmp_path / "none" / "runs.sqlite")
    assert s.list_runs() == [] and s.get_run(1) is None and s.metrics(1) == []
    assert s.health(1) == [] and s.events(1) == []
    assert not (tmp_path / "none").exists()


def test_a_store_of_the_first_version_is_read_then_upgraded_in_place(tmp_path):
    """A store written before ranks had mesh coordinates: read as it is (the mesh unknown), and
    given the column, once, when a writer opens it; nothing in it is lost."""
    from nbdist.telemetry import tables

    path = tmp_path / "runs.sqlite"
    first = tables.SCHEMA.replace("    mesh TEXT,\n", "").replace("    data_share REAL,\n", "")
    first = first.replace(",\n    data_share REAL", "")
    first = first.replace(",\n    listed INTEGER NOT NULL DEFAULT 1", "")
    first = re.sub(
        r"CREATE TABLE IF NOT EXISTS summaries.*?ON summaries \(name\);", "", first, flags=re.S
    )
    assert "mesh" not in first and "listed" not in first and "data_share" not in first
    with sqlite3.connect(path) as c:
        c.executescript(f"{first}PRAGMA user_version = 1;")
        c.execute("INSERT INTO runs (started, updated) VALUES (1.0, 1.0)")
        c.execute("INSERT INTO health (run_id, rank, time, host) VALUES (1, 0, 2.0, 'h0')")
    old = RunStore(path).health(1)
    assert [(r["rank"], r["host"], r["mesh"], r["data_share"]) for r in old] == [
        (0, "h0", None, None)
    ]
    assert set(old[0]) == set(HEALTH_COLUMNS)  # what the sidebar reads, as from a new store

    writers = [RunStore(path), RunStore(path)]  # the second finds it upgraded already
    for w in writers:
        w.put_health(
            1, [WorkerHealth(rank=1, time=3.0, host="h1", mesh="pp 1/2 dp 0/1", data_share=0.25)]
        )
    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == tables.SCHEMA_VERSION == 4
        assert [r[1] for r in c.execute("PRAGMA table_info(health)")].count("mesh") == 1
        assert [r[1] for r in c.execute("PRAGMA table_info(runs)")].count("listed") == 1
        for table in ("health", "health_samples"):
            columns = [r[1] for r in c.execute(f"PRAGMA table_info({table})")]
            assert columns.count("data_share") == 1
    assert [(r["rank"], r["mesh"], r["data_share"]) for r in writers[0].health(1)] == [
        (0, None, None),
        (1, "pp 1/2 dp 0/1", 0.25),
    ]
    assert writers[0].health_history(1)[-1]["data_share"] == 0.25
    assert RunStore(path).list_runs()[0]["id"] == 1


def test_a_running_run_whose_writer_vanished_reads_as_lost(tmp_path, monkeypatch):
    s = RunStore(tmp_path / "runs.sqlite")
    rid = s.start_run(name="x")
    assert s.list_runs()[0]["status"] == "running"
    import nbdist.telemetry.store as store_mod

    monkeypatch.setattr(store_mod, "LOST_AFTER", -1.0)
    assert s.get_run(rid)["status"] == "lost"
    s.end_run(rid, "ok")
    assert s.get_run(rid)["status"] == "ok"


_READER = """
import sys, time
from nbdist.telemetry.store import RunStore
s = RunStore(sys.argv[1])
seen, errors, deadline = 0, 0, time.monotonic() + 60
while time.monotonic() < deadline:
    runs = s.list_runs()
    if runs:
        rows = s.metrics(runs[0]["id"])
        steps = [r["step"] for r in rows]
        assert steps == sorted(steps) and len(set(steps)) == len(steps), "torn read"
        seen = max(seen, len(rows))
        s.health(runs[0]["id"]); s.events(runs[0]["id"])
        if runs[0]["status"] == "ok":
            break
print(seen)
"""


def test_another_process_reads_while_the_run_is_written(tmp_path):
    path = tmp_path / "runs.sqlite"
    s = RunStore(path)
    rid = s.start_run(name="concurrent")
    reader = subprocess.Popen(
        [sys.executable, "-c", _READER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        for step in range(300):
            s.add_metrics(rid, [{"time": time.time(), "rank": 0, "step": step, "loss": 1.0}])
            if step % 10 == 0:
                s.put_health(rid, [{"rank": 0, "time": time.time(), "state": "ok"}])
                s.add_event(rid, "checkpoint", 0, f"step {step}")
        s.end_run(rid, "ok")
        out, _ = reader.communicate(timeout=60)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    assert reader.returncode == 0
    assert int(out) == 300


def test_typed_records_go_in_and_the_same_names_come_out(tmp_path):
    s = RunStore(tmp_path / "runs.sqlite")
    rid = s.start_run(name="typed", world_size=2)
    s.add_metric_records(
        rid,
        [
            (
                0,
                [
                    MetricRecord(1.0, 0, 2.0, 16, 10, {"lr": 0.1}),
                    MetricRecord(2.0, 1, None, 16, 10, None),
                ],
            ),
            (1, [MetricRecord(1.5, 0, float("inf"), None, None, {"x": float("nan")})]),
        ],
    )
    assert [{k: r[k] for k in r if k != "id"} for r in s.metrics(rid)] == [
        {
            "time": 1.0,
            "rank": 0,
            "step": 0,
            "loss": 2.0,
            "nonfinite": None,
            "samples": 16,
            "extra": {"lr": 0.1},
        },
        {
            "time": 2.0,
            "rank": 0,
            "step": 1,
            "loss": None,
            "nonfinite": None,
            "samples": 16,
            "extra": {},
        },
        {
            "time": 1.5,
            "rank": 1,
            "step": 0,
            "loss": None,
            "nonfinite": "inf",
            "samples": None,
            "extra": {"x": "nan"},
        },
    ]
    h = WorkerHealth(
        rank=1,
        time=3.0,
        host="h1",
        state="slow",
        cpu=float("inf"),
        rss=2e8,
        step_time=0.2,
        heartbeat_age=0.1,
        mesh="dp 1/2 tp 0/2",
    )
    s.put_health(rid, [h])
    [row] = s.health(rid)
    assert row == {**dataclasses.asdict(h), "cpu": None}
    s.add_events(rid, [RunEvent(4.0, "restart", None, "restart 1", {"restarts": 1})])
    [e] = s.events(rid)
    assert {k: e[k] for k in e if k != "id"} == {
        "time": 4.0,
        "kind": "restart",
        "rank": None,
        "message": "restart 1",
        "data": {"restarts": 1},
    }


def test_writer_batches_in_the_background_and_closes_cleanly(tmp_path):
    s = RunStore(tmp_path / "runs.sqlite")
    w = StoreWriter(s, interval=0.05)
    rid = w.start_run(name="bg", world_size=1)
    for i in range(500):
        w.add_metrics(rid, i % 2, [MetricRecord(time.time(), i, 1.0 / (i + 1), 8, None, None)])
    w.add_events(rid, [RunEvent(time.time(), "checkpoint", 0, "x", None)])
    w.put_health(rid, [WorkerHealth(rank=0, time=time.time(), state="ok")])
    w.update_run(rid, step=500, samples_per_s=10.0)
    wait_until(lambda: len(s.metrics(rid)) == 500, 10, what="background writes")
    w.end_run(rid, "ok")
    w.close()
    assert not w._thread.is_alive()
    run = s.get_run(rid)
    assert (run["status"], run["step"], run["samples_per_s"]) == ("ok", 500, 10.0)
    assert w.error is None and run["ended"] is not None
    rows = s.metrics(rid)
    assert [r["step"] for r in rows] == list(range(500))  # in order, every one
    assert math.isclose(rows[-1]["loss"], 1 / 500) and rows[-1]["rank"] == 1
    assert [e["kind"] for e in s.events(rid)] == ["checkpoint"] and len(s.health(rid)) == 1


def test_writer_keeps_the_order_of_appends_and_changes(tmp_path):
    """Consecutive appends are merged into one transaction, never moved past a change."""
    s = RunStore(tmp_path / "runs.sqlite")
    w = StoreWriter(s, interval=60)  # nothing is written until close()
    rid = w.start_run(name="order")
    other = s.start_run(name="other")
    w.add_events(rid, [RunEvent(1.0, "a", None, "", None)])
    w.add_events(other, [RunEvent(1.5, "x", None, "", None)])
    w.add_events(rid, [RunEvent(2.0, "b", None, "", None)])
    w.delete_run(other)
    w.end_run(rid, "failed", [{"rank": 0, "summary": "boom", "kind": "error"}])
    w.add_events(rid, [RunEvent(3.0, "c", None, "", None)])
    w.close()
    assert [e["kind"] for e in s.events(rid)] == ["a", "b", "c"]
    assert s.get_run(other) is None and s.events(other) == []
    assert s.get_run(rid)["failures"] == [{"rank": 0, "summary": "boom", "kind": "error"}]


def test_flush_soon_writes_at_once_what_waits(tmp_path):
    """A dead rank must reach the sidebar within a second: the monitor asks for a write now."""
    from processes import wait_until

    s = RunStore(tmp_path / "runs.sqlite")
    w = StoreWriter(s, interval=60)  # left alone, nothing is written for a minute
    rid = w.start_run(name="urgent")
    w.add_events(rid, [RunEvent(1.0, "died", 1, "its engine is gone", None)])
    w.flush_soon()
    wait_until(lambda: s.events(rid), 1.0, interval=0.01, what="the event in the store")
    w.close()


def test_unwritable_store_is_reported_once_and_nothing_raises(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    w = StoreWriter(RunStore(blocker / "sub" / "runs.sqlite"))
    assert w.start_run(name="x") is None
    assert w.error is not None and w.error.startswith(("NotADirectoryError", "FileExistsError"))
    w.add_metrics(1, 0, [MetricRecord(0.0, None, None, None, None, None)])  # dropped, no error
    w.close()


class _TinyDisk(RunStore):
    """A store whose file may not grow past a few pages: SQLite's 'database or disk is full'."""

    def connect(self, create):
        conn = super().connect(create)
        if conn is not None:
            conn.execute("PRAGMA max_page_count = 12")
        return conn


def test_a_full_disk_mid_run_stops_recording_but_not_the_caller(tmp_path):
    w = StoreWriter(_TinyDisk(tmp_path / "runs.sqlite"), interval=0.02)
    rid = w.start_run(name="full")
    assert rid is not None
    big = "x" * 2000
    for i in range(200):
        w.add_events(rid, [RunEvent(time.time(), "warning", i, big, None)])
    wait_until(lambda: w.error is not None, 10, what="the write error")
    assert "full" in w.error
    w.add_events(rid, [RunEvent(0.0, "x", None, "", None)])  # ignored from now on
    w.close()


def _hold(path) -> sqlite3.Connection:
    """Another writer in the middle of a transaction: it holds the store's write lock."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    return conn


def _metric(step: int) -> list[MetricRecord]:
    return [MetricRecord(time.time(), step, 1.0, 8, None, None)]


def test_a_locked_store_delays_recording_and_loses_nothing(tmp_path):
    """ "database is locked" (another writer past the busy timeout) is waited out: what was
    queued meanwhile is written once the lock goes, in order, and recording goes on."""
    s = RunStore(tmp_path / "runs.sqlite", busy_timeout=0.05)
    w = StoreWriter(s, interval=0.02)
    rid = w.start_run(name="locked")
    w.add_metrics(rid, 0, _metric(0))
    wait_until(lambda: len(s.metrics(rid)) == 1, 10, what="the first row")
    holder = _hold(s.path)
    try:
        for i in range(1, 40):
            w.add_metrics(rid, 0, _metric(i))
            if i == 20:
                w.add_events(rid, [RunEvent(time.time(), "checkpoint", 0, "step 20", None)])
                w.update_run(rid, step=20)
        wait_until(lambda: w.retries >= 3, 10, what="the writer to meet the lock")
        assert w.error is None and len(s.metrics(rid)) == 1  # readers are not blocked (WAL)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    for i in range(40, 50):
        w.add_metrics(rid, 0, _metric(i))
    w.update_run(rid, step=49)
    wait_until(lambda: len(s.metrics(rid)) == 50, 10, what="the rows queued while locked")
    w.close()
    assert w.error is None
    assert [r["step"] for r in s.metrics(rid)] == list(range(50))  # in order, each once
    assert [e["kind"] for e in s.events(rid)] == ["checkpoint"] and s.get_run(rid)["step"] == 49


def test_close_waits_out_a_lock_within_its_timeout(tmp_path):
    s = RunStore(tmp_path / "runs.sqlite", busy_timeout=0.05)
    w = StoreWriter(s, interval=60)
    rid = w.start_run(name="closing")
    held = threading.Event()

    def hold_until_the_writer_waits():
        holder = _hold(s.path)
        held.set()
        try:
            wait_until(lambda: w.retries >= 2, 10, interval=0.01, what="a retry")
        finally:
            holder.execute("ROLLBACK")
            holder.close()

    t = threading.Thread(target=hold_until_the_writer_waits)
    t.start()
    assert held.wait(10)
    w.add_metrics(rid, 0, _metric(0))
    w.end_run(rid, "ok")
    w.close(timeout=20)
    t.join(10)
    assert w.error is None and s.get_run(rid)["status"] == "ok" and len(s.metrics(rid)) == 1


def test_a_store_locked_for_good_is_given_up_with_one_error(tmp_path):
    s = RunStore(tmp_path / "runs.sqlite", busy_timeout=0.02)
    w = StoreWriter(s, interval=0.02, give_up_after=0.5)
    rid = w.start_run(name="stuck")
    holder = _hold(s.path)
    try:
        w.add_metrics(rid, 0, _metric(0))
        wait_until(lambda: w.error is not None, 15, what="the writer to give up")
        assert w.error == "OperationalError: database is locked (for 0.5 s)"
        w.add_metrics(rid, 0, _metric(1))  # dropped from now on, without an error
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    w.close()
    assert s.metrics(rid) == []


def test_a_data_folder_of_another_user_is_refused_by_readers_and_the_writer(tmp_path, monkeypatch):
    """Records in someone else's folder could be planted: nothing is read or written there,
    and the run goes on unrecorded with one warning (``error``)."""
    if os.geteuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    monkeypatch.setenv("NBDIST_DATA_DIR", str(theirs))
    with pytest.raises(UsageError, match="belongs to another user"):
        RunStore().list_runs()
    w = StoreWriter(RunStore())
    assert w.start_run(name="x") is None and "belongs to another user" in w.error
    w.close()
    assert os.listdir(theirs) == []


def test_update_run_refuses_unknown_fields(tmp_path):
    s = RunStore(tmp_path / "runs.sqlite")
    rid = s.start_run()
    with pytest.raises(ValueError, match="bogus"):
        s.update_run(rid, bogus=1)
