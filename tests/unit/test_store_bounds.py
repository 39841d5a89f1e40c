"""What enters the run store is checked, and its writer is bounded and never dies silently.

A number that is not finite never reaches a row (a run's rate, a metric's samples: unknown); a
record the store cannot keep truthfully (``report(step=2**63)``: SQLite's INTEGER is 64-bit) is
refused alone, counted and said, and the writer goes on; what waits for a locked store is
bounded (dropped past the bound, counted, said); a fault of nbdist's own ends the writer with
``error`` set and stops its queue from growing.
"""

from __future__ import annotations

import json
import sqlite3
import time

import pytest
from processes import wait_until

from nbdist.telemetry import rows
from nbdist.telemetry.events import MetricRecord, RunEvent, WorkerHealth
from nbdist.telemetry.store import RunStore
from nbdist.telemetry.writer import StoreWriter

INF, NAN = float("inf"), float("nan")


def _rec(step, t=None, loss=1.0, samples=8) -> MetricRecord:
    return MetricRecord(time.time() if t is None else t, step, loss, samples, None, None)


def _strict(value) -> None:
    """Fails on NaN or Infinity, which are not JSON."""
    json.dumps(value, allow_nan=False)


def test_run_numbers_that_are_not_finite_or_too_large_are_stored_as_unknown(tmp_path):
    s = RunStore(tmp_path / "runs.sqlite")
    rid = s.start_run(name="r", world_size=2, total=2**70)
    assert s.get_run(rid)["total"] is None
    for rate in (INF, -INF, NAN):
        s.update_run(rid, samples_per_s=rate, step=2**63, loss=rate)
        run = s.get_run(rid)
        assert (run["samples_per_s"], run["step"], run["loss"]) == (None, None, None)
        assert run["nonfinite"] in ("inf", "-inf", "nan")
    s.update_run(rid, samples_per_s=125.5, step=2**63 - 1, total=10)
    run = s.get_run(rid)
    assert (run["samples_per_s"], run["step"], run["total"]) == (125.5, 2**63 - 1, 10)
    s.end_run(rid, "ok", ended=INF)
    run = s.get_run(rid)
    assert run["status"] == "ok" and run["ended"] is None
    _strict([s.list_runs(), run])


def test_metric_samples_and_health_measures_that_are_not_finite_are_null(tmp_path):
    s = RunStore(tmp_path / "runs.sqlite")
    rid = s.start_run()
    s.add_metric_records(rid, [(0, [_rec(0, samples=INF), _rec(1, samples=NAN, loss=10**400)])])
    rows = s.metrics(rid)
    assert [(r["samples"], r["loss"], r["nonfinite"]) for r in rows] == [
        (None, 1.0, None),
        (None, None, "inf"),
    ]
    s.put_health(rid, [WorkerHealth(rank=0, time=time.time(), cpu=INF, rss=10**400, gpu_util=5)])
    [h] = s.health(rid)
    assert (h["cpu"], h["rss"], h["gpu_util"]) == (None, None, 5.0)
    _strict([rows, h, s.health_history(rid)])


@pytest.mark.parametrize(
    "bad,words",
    [
        (_rec(2**63), "step 9223372036854775808 is not a whole number from -2**63"),
        (_rec(-(2**63) - 1), "step -9223372036854775809"),
        (_rec(1.5), "step 1.5"),
        (_rec(1, t=NAN), "time nan is not a finite number"),
        (_rec(1, t=INF), "time inf"),
    ],
)
def test_a_record_the_store_cannot_keep_is_refused_alone(tmp_path, bad, words):
    s = RunStore(tmp_path / "runs.sqlite")
    rid = s.start_run()
    with pytest.raises(rows.BadValue, match=words.replace("*", r"\*")):
        s.add_metric_records(rid, [(0, [_rec(0), bad, _rec(2)])])
    assert s.metrics(rid) == []  # asked strictly: nothing of the batch is written
    refused = rows.Refused()
    s.add_metric_records(rid, [(0, [_rec(0), bad]), (1, [_rec(2)])], refused=refused)
    assert [(r["rank"], r["step"]) for r in s.metrics(rid)] == [(0, 0), (1, 2)]
    assert refused.count == 1 and words in refused.first


def test_events_and_health_of_a_bad_time_or_rank_are_refused_alone(tmp_path):
    s = RunStore(tmp_path / "runs.sqlite")
    rid = s.start_run()
    refused = rows.Refused()
    s.add_events(
        rid,
        [RunEvent(1.0, "a", None, "", None), RunEvent(INF, "b", 0, "", None)],
        refused=refused,
    )
    s.put_health(
        rid,
        [WorkerHealth(rank=0, time=1.0), WorkerHealth(rank=2**64, time=1.0)],
        refused=refused,
    )
    assert [e["kind"] for e in s.events(rid)] == ["a"]
    assert [h["rank"] for h in s.health(rid)] == [0] and len(s.health_history(rid)) == 1
    assert refused.count == 2 and "event's time inf" in refused.first


def test_events_are_read_a_page_at_a_time(tmp_path):
    s = RunStore(tmp_path / "runs.sqlite")
    rid = s.start_run()
    other = s.start_run()
    s.add_events(rid, [RunEvent(float(i), f"k{i}", None, "", None) for i in range(10)])
    s.add_events(other, [RunEvent(0.0, "other", None, "", None)])
    first = s.events(rid, limit=4)
    assert [e["kind"] for e in first] == ["k0", "k1", "k2", "k3"]
    assert [e["kind"] for e in s.events(rid, first[-1]["id"], 4)] == ["k4", "k5", "k6", "k7"]
    assert [e["kind"] for e in s.latest_events(rid, 3)] == ["k7", "k8", "k9"]  # oldest first
    assert s.count_events(rid) == 10 and s.count_events(other) == 1


# -- the writer ----------------------------------------------------------------------------------
def test_a_step_past_2_63_costs_its_record_only_and_the_writer_goes_on(tmp_path):
    """``report(step=2**63)`` once killed the writer's thread, which then queued every later
    record for ever. Now the record alone is refused, said once, and recording goes on."""
    said: list[str] = []
    s = RunStore(tmp_path / "runs.sqlite")
    w = StoreWriter(s, interval=0.02, warn=said.append)
    rid = w.start_run(name="huge step")
    w.add_metrics(rid, 0, [_rec(0), _rec(2**63), _rec(2)])
    w.add_metrics(rid, 1, [_rec(0)])
    wait_until(lambda: len(s.metrics(rid)) == 3, 10, what="the good records")
    assert w.error is None and w._thread.is_alive()
    assert w.refused.count == 1 and len(said) == 1
    assert "refused 1 record(s)" in said[0] and "step 9223372036854775808" in said[0]
    for i in range(3, 6):  # the next records, and another bad one: not said again until close
        w.add_metrics(rid, 0, [_rec(i), _rec(-(2**70))])
    w.update_run(rid, step=2**63, samples_per_s=INF)  # a run's numbers: unknown, not refused
    w.end_run(rid, "ok")
    w.close()
    assert [r["step"] for r in s.metrics(rid) if r["rank"] == 0] == [0, 2, 3, 4, 5]
    run = s.get_run(rid)
    assert (run["status"], run["step"], run["samples_per_s"]) == ("ok", None, None)
    assert w.refused.count == 4 and len(said) == 2 and "refused 4 record(s) of this run" in said[1]
    assert w.error is None


def test_what_waits_for_a_locked_store_is_bounded_and_the_loss_said(tmp_path):
    said: list[str] = []
    s = RunStore(tmp_path / "runs.sqlite", busy_timeout=0.02)
    w = StoreWriter(s, interval=0.02, max_queued=100, warn=said.append)
    rid = w.start_run(name="locked")
    holder = sqlite3.connect(s.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the store
    try:
        for i in range(150):
            w.add_metrics(rid, i % 2, [_rec(i)])
        w.update_run(rid, step=150)  # a change of the run is never dropped
        assert w.dropped == 50 and w._queued == 100
        assert len(said) == 1 and "is behind (100 rows wait to be written)" in said[0]
        wait_until(lambda: w.retries >= 2, 10, what="the writer to meet the lock")
        for i in range(150, 160):
            w.add_metrics(rid, 0, [_rec(i)])
        assert w.dropped == 60 and len(said) == 1  # counted, said once
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    wait_until(lambda: len(s.metrics(rid)) == 100, 10, what="the queued rows")
    w.add_metrics(rid, 0, [_rec(160)])  # room again
    w.close()
    assert [r["step"] for r in s.metrics(rid)] == [*range(100), 160]  # in order, each once
    assert s.get_run(rid)["step"] == 150 and w.error is None and w._queued == 0
    assert len(said) == 2 and "dropped 60 row(s) of this run" in said[1]


def test_a_fault_on_the_writer_thread_is_said_and_stops_the_queue(tmp_path, monkeypatch):
    s = RunStore(tmp_path / "runs.sqlite")
    w = StoreWriter(s, interval=0.02, warn=lambda line: None)
    rid = w.start_run(name="bug")

    def broken(*args, **kwargs):
        raise RuntimeError("a bug of nbdist's own")

    monkeypatch.setattr(RunStore, "add_events", broken)
    w.add_events(rid, [RunEvent(1.0, "x", None, "", None)])
    wait_until(lambda: w.error is not None, 10, what="the writer to report its fault")
    assert w.error == "the store writer stopped (RuntimeError: a bug of nbdist's own)"
    w._thread.join(10)
    assert not w._thread.is_alive()
    for i in range(1000):  # nothing more is queued: the queue cannot grow without bound
        w.add_metrics(rid, 0, [_rec(i)])
    assert w._queued == 0 and not w._ops
    w.close()
