"""No answer of the run endpoints grows with a run's length, and every one is strict JSON.

Against a real Jupyter server (pytest-jupyter) with nbdist loaded: raw metric rows and events go
out a page at a time, with the cursor of the next; a wide run's health history shares one budget
of points; a number that is not finite (an older store may hold one) is sent as null; the JSON
is made on a reader thread, not the server's event loop. And end to end, on a real cluster:
``report(step=2**63)`` and ``report(samples=inf)`` reach the store as a refused record (said)
and an unknown rate, and the sidebar's answers stay strict JSON.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time

import pytest
from clusters import watched
from test_server import fetch_error

from nbdist.config import CellOptions, TelemetryConfig
from nbdist.notebook.run.observers.store import RunRecord
from nbdist.server import curves as server_curves
from nbdist.server import pages
from nbdist.telemetry.store import RunStore

API = ("nbdist", "api")


async def get(jp_fetch, *parts, **params) -> tuple[dict, int]:
    """The JSON of a GET, parsed strictly (NaN and Infinity are not JSON), and its size."""
    r = await jp_fetch(
        *API, *map(str, parts), params={k: str(v) for k, v in params.items()} or None
    )

    def refuse(word):
        raise AssertionError(f"{word} in {parts}: not strict JSON")

    return json.loads(r.body, parse_constant=refuse), len(r.body)


def _rows(steps: int, ranks: int = 2) -> list[dict]:
    return [
        {"time": float(i), "rank": r, "step": i, "loss": 1.0 / (i + 1), "extra": {"acc": 0.5}}
        for i in range(steps)
        for r in range(ranks)
    ]


async def test_metric_rows_come_a_bounded_page_at_a_time_each_once(jp_fetch, data_dir):
    s = RunStore()
    rid = s.start_run(world_size=2)
    s.add_metrics(rid, _rows(2500))  # 5,000 rows
    seen, since, sizes = [], 0, []
    while since is not None:
        data, size = await get(jp_fetch, "runs", rid, "metrics", since_id=since)
        assert len(data["metrics"]) <= pages.METRICS_PAGE
        seen += [m["id"] for m in data["metrics"]]
        sizes.append(size)
        since = data["next"]
    assert len(sizes) == 5 and max(sizes) < 200 * pages.METRICS_PAGE  # ~110 bytes a row
    assert seen == [m["id"] for m in s.metrics(rid)]  # every row once, in order
    data, _ = await get(jp_fetch, "runs", rid, "metrics", since_id=seen[-1])
    assert data == {"metrics": [], "last_id": seen[-1], "next": None}  # a live run polls on
    s.add_metrics(rid, _rows(1, ranks=1))
    data, _ = await get(jp_fetch, "runs", rid, "metrics", since_id=data["last_id"])
    assert len(data["metrics"]) == 1 and data["next"] is None
    data, _ = await get(jp_fetch, "runs", rid, "metrics", limit=3000)
    assert len(data["metrics"]) == 3000 and data["next"] == data["last_id"] == seen[2999]
    code, message = await fetch_error(
        jp_fetch, "runs", str(rid), "metrics", params={"limit": str(pages.MAX_PAGE + 1)}
    )
    assert code == 400 and f"from 1 to {pages.MAX_PAGE}" in message
    s.close()


async def test_events_are_the_latest_or_a_page_and_say_how_many(jp_fetch, data_dir):
    s = RunStore()
    rid = s.start_run(world_size=1)
    s.add_events(rid, [{"time": float(i), "kind": "sync", "message": str(i)} for i in range(1500)])
    data, _ = await get(jp_fetch, "runs", rid, "events")
    assert data["total"] == 1500 and len(data["events"]) == pages.EVENTS_PAGE
    assert [e["message"] for e in data["events"]][:1] == ["500"]  # the latest, oldest first
    assert data["events"][-1]["message"] == "1499" and data["next"] is None
    data, _ = await get(jp_fetch, "runs", rid, "events", since_id=0, limit=600)
    assert [e["message"] for e in data["events"]][-1] == "599" and data["next"] is not None
    data, _ = await get(jp_fetch, "runs", rid, "events", since_id=data["next"], limit=1000)
    assert [e["message"] for e in data["events"]][:1] == ["600"] and len(data["events"]) == 900
    assert data["next"] is None
    s.close()


async def test_a_wide_runs_health_history_shares_one_budget(jp_fetch, data_dir, monkeypatch):
    monkeypatch.setattr(server_curves, "MAX_SENT", 600)
    s = RunStore()
    rid = s.start_run(world_size=16)
    started = s.get_run(rid)["started"]
    for i in range(60):
        s.put_health(
            rid,
            [
                {"rank": r, "time": started + i, "cpu": float(i % 7), "rss": 1e8 + i, "state": "ok"}
                for r in range(16)
            ],
        )
    s.end_run(rid, "ok")
    data, _ = await get(jp_fetch, "runs", rid, "health", "history", points=2000)
    sent = sum(len(m["x"]) for r in data["ranks"] for m in r["measures"].values())
    assert len(data["ranks"]) == 16 and sent <= 600 + 2 * 16 * 2  # the budget, and both ends
    s.close()


async def test_numbers_that_are_not_finite_are_sent_as_null(jp_fetch, data_dir):
    """The store keeps them out now; an older store may hold them, and JSON has no word for
    them (``report(samples=inf)`` once stopped the sidebar refreshing)."""
    s = RunStore()
    rid = s.start_run(world_size=1)
    s.add_metrics(rid, _rows(3, ranks=1))
    s.put_health(rid, [{"rank": 0, "time": time.time(), "state": "ok", "cpu": 1.0}])
    s.add_event(rid, "sync", message="m", data={"drift": 1.0})
    s.update_run(rid, samples_per_s=float("inf"))
    assert s.get_run(rid)["samples_per_s"] is None  # refused where it enters
    with sqlite3.connect(s.path) as c:  # as an older nbdist wrote them
        c.execute("UPDATE runs SET samples_per_s = ?, loss = ?", (float("inf"), float("-inf")))
        c.execute("UPDATE metrics SET samples = ?, extra = '{\"acc\": NaN}'", (float("inf"),))
        c.execute("UPDATE health SET cpu = ?", (float("inf"),))
        c.execute("UPDATE events SET data = '{\"drift\": Infinity}'")
    (runs, _), (run, _) = [await get(jp_fetch, "runs"), await get(jp_fetch, "runs", rid)]
    assert runs["runs"][0]["samples_per_s"] is None and run["run"]["loss"] is None
    metrics, _ = await get(jp_fetch, "runs", rid, "metrics")
    assert {(m["samples"], m["extra"]["acc"]) for m in metrics["metrics"]} == {(None, None)}
    health, _ = await get(jp_fetch, "runs", rid, "health")
    events, _ = await get(jp_fetch, "runs", rid, "events")
    assert health["workers"][0]["cpu"] is None and events["events"][0]["data"]["drift"] is None
    await get(jp_fetch, "runs", rid, "curves", ranks=1)
    await get(jp_fetch, "runs", rid, "health", "history")
    s.close()


async def test_answers_are_encoded_off_the_event_loop(jp_fetch, data_dir, monkeypatch):
    s = RunStore()
    rid = s.start_run(world_size=2)
    s.add_metrics(rid, _rows(10))
    threads = []
    real = pages.encode

    def noting(data):
        threads.append(threading.current_thread().name)
        return real(data)

    monkeypatch.setattr(pages, "encode", noting)
    for parts in [(), (rid,), (rid, "metrics"), (rid, "events"), (rid, "curves")]:
        await get(jp_fetch, "runs", *parts)
    assert len(threads) == 5 and all(t.startswith("nbdist-store") for t in threads), threads
    s.close()


# -- end to end: a real cluster reports what the store cannot keep --------------------------------


@pytest.mark.usefixtures("no_front_end")
async def test_huge_steps_and_infinite_samples_from_a_cell(jp_fetch, data_dir, cluster, capsys):
    src = (
        "for i in range(5):\n"
        "    nbdist.report(step=i, loss=1.0 / (i + 1), samples=float('inf'))\n"
        "try:\n"
        "    nbdist.report(step=2**63, loss=0.1)\n"
        "except nbdist.UsageError as e:\n"
        "    said = str(e)\n"
        "nbdist.report(step=5, loss=0.1)\n"
        "said"
    )
    opts = CellOptions(dashboard=False)
    mon = watched(cluster, src, opts, cfg=TelemetryConfig(), store_at=RunStore())
    writer = mon.find(RunRecord).writer
    said = cluster.run(src, opts, watch=mon)
    # refused where it enters, in one line; the store's own refusal is test_store_bounds's
    assert (
        said
        == "nbdist.report: step 9223372036854775808 is too large to record: keep it below 2**63"
    )
    assert writer.error is None and writer.refused.count == 0
    rows = writer.store.metrics(mon.run_id)
    assert sorted(r["step"] for r in rows) == sorted([*range(5), 5] * 2)  # the rest are kept
    runs, _ = await get(jp_fetch, "runs")
    assert runs["runs"][0]["id"] == mon.run_id and runs["runs"][0]["samples_per_s"] is None
    data, _ = await get(jp_fetch, "runs", mon.run_id, "metrics")
    assert len(data["metrics"]) == 12 and {m["samples"] for m in data["metrics"]} == {None}
    curves, _ = await get(jp_fetch, "runs", mon.run_id, "curves")
    assert curves["metrics"][0]["mean"]["x"] == [0, 1, 2, 3, 4, 5]
