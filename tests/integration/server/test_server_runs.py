"""``GET /nbdist/api/runs``: every run findable, a page at a time, through a real Jupyter server.

Against pytest-jupyter's server with nbdist loaded (tests/conftest.py): pages walk every listed
run once, with the total; ``q`` finds a part of a name in any case; ``status`` filters; ``sort``
takes any summary metric (runs without it last) or time, duration, name, status, step, either
way; ``all=1`` adds the session's other cells. Bad parameters are a 400 in one line that names
the fix, and no token is a 403. With 5,000 runs in the store an answer takes milliseconds, not
a scan per request of every run's rows.
"""

from __future__ import annotations

import sqlite3
import time

import pytest
from test_server import fetch_error, fetch_json

from nbdist.telemetry.store import RunStore


@pytest.fixture
def runs(data_dir) -> dict[str, list[int]]:
    """45 named runs (their loss and acc summaries known), 3 failed, 1 live, 5 plain cells."""
    s = RunStore()
    named = []
    for i in range(45):
        rid = s.start_run(name=f"{'CNN' if i % 3 == 0 else 'mlp'}-lr{i:02d}", started=1000.0 + i)
        s.put_summary(rid, {"loss": (1.0 + (i * 7) % 45, 0.5, 9.0)})
        if i % 2 == 0:
            s.put_summary(rid, {"acc": (i / 100, 0.0, i / 100)})
        s.end_run(rid, "ok", ended=1010.0 + 2 * i)
        named.append(rid)
    failed = []
    for _ in range(3):
        failed.append(s.start_run())
        s.end_run(failed[-1], "failed")
    plain = []
    for _ in range(5):
        plain.append(s.start_run())
        s.end_run(plain[-1], "ok")
    live = s.start_run(name="live")
    yield {"named": named, "failed": failed, "plain": plain, "live": [live]}
    s.close()


async def _page(jp_fetch, **params) -> dict:
    code, data = await fetch_json(jp_fetch, "runs", params={k: str(v) for k, v in params.items()})
    assert code == 200
    return data


async def test_pages_walk_every_run_once_with_the_total(jp_fetch, runs):
    seen, offset = [], 0
    while True:
        data = await _page(jp_fetch, offset=offset, limit=20)
        assert data["total"] == 49 and data["offset"] == offset and data["limit"] == 20
        seen += [r["id"] for r in data["runs"]]
        offset += 20
        if offset >= data["total"]:
            break
    newest_first = runs["live"] + runs["failed"][::-1] + runs["named"][::-1]
    assert seen == newest_first  # the plain cells are in no page
    assert (await _page(jp_fetch, offset=60))["runs"] == []
    every = await _page(jp_fetch, all=1, limit=1000)
    assert every["total"] == 54 and set(runs["plain"]) <= {r["id"] for r in every["runs"]}
    assert not any(r["listed"] for r in every["runs"] if r["id"] in runs["plain"])
    # the old call goes on answering as it did: the latest runs
    assert [r["id"] for r in (await _page(jp_fetch, limit=1))["runs"]] == runs["live"]


async def test_search_by_a_part_of_the_name_and_filter_by_status(jp_fetch, runs):
    data = await _page(jp_fetch, q="cnn")
    assert data["total"] == 15 and all(r["name"].startswith("CNN-") for r in data["runs"])
    data = await _page(jp_fetch, q="LR1", limit=5)
    assert data["total"] == 10 and len(data["runs"]) == 5
    assert {r["name"] for r in data["runs"]} <= {
        f"{p}-lr1{d}" for p in ("CNN", "mlp") for d in range(10)
    }
    failed = await _page(jp_fetch, status="failed")
    assert [r["id"] for r in failed["runs"]] == runs["failed"][::-1] and failed["total"] == 3
    data = await _page(jp_fetch, status="running,failed", q="live")
    assert [r["id"] for r in data["runs"]] == runs["live"]
    assert (await _page(jp_fetch, q="no such run"))["total"] == 0


async def test_sort_by_any_summary_metric_or_field_either_way(jp_fetch, runs):
    data = await _page(jp_fetch, sort="loss", limit=1000)
    losses = [r["summary"]["loss"]["last"] for r in data["runs"] if "loss" in r["summary"]]
    assert losses == sorted(losses) and len(losses) == 45
    assert [r["id"] for r in data["runs"][-4:]] == [*runs["live"], *runs["failed"][::-1]]
    down = await _page(jp_fetch, sort="last:loss", order="desc", limit=3)
    assert [r["summary"]["loss"]["last"] for r in down["runs"]] == [45.0, 44.0, 43.0]
    acc = await _page(jp_fetch, sort="max:acc", order="desc", limit=2)
    assert [r["summary"]["acc"]["max"] for r in acc["runs"]] == [0.44, 0.42]
    assert acc["metrics"] == ["loss", "acc"]  # the most common first: what the runs sort by
    names = await _page(jp_fetch, sort="name", limit=2)
    assert [r["name"] for r in names["runs"]] == ["CNN-lr00", "CNN-lr03"]
    longest = await _page(jp_fetch, sort="duration", status="ok", limit=1)
    assert longest["runs"][0]["id"] == runs["named"][-1]  # 10 + 2 x 44 s
    shortest = await _page(jp_fetch, sort="duration", order="asc", status="ok", limit=1)
    assert shortest["runs"][0]["id"] == runs["named"][0]


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"status": "done"}, "'done' is not a run's status: use running, ok, failed"),
        ({"sort": "max:"}, "names no metric: use max:loss"),
        ({"order": "up"}, "order takes asc or desc"),
        ({"offset": "-1"}, "offset must be a whole number from 0"),
        ({"limit": "1001"}, "limit must be a whole number from 1 to 1000"),
        ({"all": "yes"}, "all must be a whole number from 0 to 1"),
        ({"q": "x" * 300}, "name takes a part of a run's name"),
        ({"sort_by": "loss"}, "runs takes offset, limit, q, status, sort, order, all, not"),
    ],
)
async def test_a_bad_parameter_is_a_400_in_one_line(jp_fetch, runs, params, words):
    code, message = await fetch_error(jp_fetch, "runs", params=params)
    assert code == 400 and words in message and "\n" not in message, message


async def test_jupyterlabs_cache_buster_is_let_through(jp_fetch, runs):
    """JupyterLab's requests may end in ``?1795870490515``: a bare number, not a parameter."""
    code, data = await fetch_json(jp_fetch, "runs", params={"1795870490515": "", "limit": "2"})
    assert code == 200 and len(data["runs"]) == 2


async def test_without_a_token_the_runs_are_refused(jp_fetch, runs):
    code, _ = await fetch_error(
        jp_fetch, "runs", params={"q": "cnn"}, headers={"Authorization": ""}
    )
    assert code == 403


async def test_five_thousand_runs_answer_in_milliseconds(jp_fetch, data_dir):
    """5,000 runs, 2 metrics each in their summaries: a page of 20, searched, filtered and
    sorted by a metric, each answered well within the sidebar's once-a-second poll."""
    s = RunStore()
    s.end_run(s.start_run(name="first"), "ok")  # the tables made; the rest in one go
    with sqlite3.connect(s.path) as c:
        c.executemany(
            "INSERT INTO runs (name, started, ended, updated, status) VALUES (?,?,?,?,?)",
            [(f"run-{i}", 1e9 + i, 1e9 + i + 5, 1e9 + i + 5, "ok") for i in range(5000)],
        )
        c.executemany(
            "INSERT INTO summaries (run_id, name, last, min, max) VALUES (?,?,?,?,?)",
            [
                (i + 2, m, (i * 37) % 1000 / 10, 0.0, 99.0)
                for i in range(5000)
                for m in ("loss", "acc")
            ],
        )
    took = {}
    for label, params in [
        ("latest", {"limit": 20}),
        ("page 200", {"limit": 20, "offset": 4000}),
        ("search", {"limit": 20, "q": "run-49"}),
        ("status", {"limit": 20, "status": "ok,failed"}),
        ("by loss", {"limit": 20, "sort": "min:loss"}),
    ]:
        best = 1e9
        for _ in range(3):
            t0 = time.perf_counter()
            data = await _page(jp_fetch, **params)
            best = min(best, time.perf_counter() - t0)
        took[label] = best
        assert len(data["runs"]) == 20 and data["total"] >= 20
    print("runs endpoint, 5,000 runs:", {k: f"{v * 1000:.1f} ms" for k, v in took.items()})
    assert max(took.values()) < 0.25, took
    s.close()
