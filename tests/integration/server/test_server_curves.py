"""The sidebar's curve endpoints against a real Jupyter server (pytest-jupyter) with nbdist loaded.

``runs/ID/curves`` and ``runs/ID/health/history`` send every metric (and each rank's health) cut
to a bounded number of points; a run's rows are read in pages and folded once, so a poll of a
live run reads only its new rows; answers are strict JSON.
"""

from __future__ import annotations

import json
import math
import time

import pytest
from test_server import fetch_error

from nbdist.server import curves as server_curves
from nbdist.server.handlers import MAX_POINTS
from nbdist.telemetry.store import RunStore

API = ("nbdist", "api")


def _rows(steps: range, ranks=(0, 1), t0: float = 0.0) -> list[dict]:
    """Loss falling over six decades, acc at every step, val_loss every 10 steps."""
    out = []
    for i in steps:
        for r in ranks:
            extra = {"acc": i / 1000 + r / 10}
            if i % 10 == 0:
                extra["val_loss"] = 1.0 / (i + 1)
            loss = 2.3 * 10 ** (-6 * i / 3000)
            out.append({"time": t0 + i, "rank": r, "step": i, "loss": loss, "extra": extra})
    return out


@pytest.fixture
def run(data_dir):
    """A finished run of 3,000 steps on 2 ranks (loss, acc, val_loss)."""
    s = RunStore()
    rid = s.start_run(name="long", world_size=2, total=3000)
    s.add_metrics(rid, _rows(range(3000)))
    s.update_run(rid, step=3000, loss=2.3e-6)
    s.end_run(rid, "ok")
    yield rid
    s.close()


async def get(jp_fetch, *parts, **params):
    """The JSON of a GET, parsed strictly: NaN and Infinity are not JSON."""
    r = await jp_fetch(*API, *parts, params=params or None)

    def refuse(word):
        raise AssertionError(f"{word} in {parts}: not strict JSON")

    return json.loads(r.body, parse_constant=refuse)


def _series(jp_serverapp) -> server_curves.SeriesCache:
    return jp_serverapp.web_app.settings["nbdist"]["series"]


async def test_every_metric_in_report_order_each_line_bounded(jp_fetch, run):
    data = await get(jp_fetch, "runs", str(run), "curves", points="200")
    assert data["names"] == ["loss", "acc", "val_loss"]
    assert [m["name"] for m in data["metrics"]] == data["names"]
    assert data["complete"] and data["rows"] == 6000 and data["done"] == 3000
    assert data["dropped"] == 0
    for m in data["metrics"]:
        assert 2 <= len(m["mean"]["x"]) <= 200 and m["ranks"] == []
        assert m["mean"]["x"] == sorted(m["mean"]["x"])
    loss = data["metrics"][0]["mean"]
    assert (loss["x"][0], loss["x"][-1]) == (0, 2999)  # the first and the last kept
    assert math.isclose(loss["y"][0], 2.3) and loss["y"][-1] < 1e-5  # the whole run
    val = data["metrics"][2]["mean"]
    assert all(x % 10 == 0 for x in val["x"])  # its own cadence, on the same step axis


async def test_per_rank_lines_and_a_chosen_metric(jp_fetch, run):
    data = await get(jp_fetch, "runs", str(run), "curves", points="50", ranks="1", metrics="acc")
    assert data["names"] == ["loss", "acc", "val_loss"]  # every name, whatever is sent
    [acc] = data["metrics"]
    assert acc["name"] == "acc" and [r["rank"] for r in acc["ranks"]] == [0, 1]
    for line in acc["ranks"]:
        assert 2 <= len(line["x"]) <= 50 and len(line["x"]) == len(line["y"])
    assert acc["ranks"][1]["y"][0] == pytest.approx(0.1)  # rank 1's own values
    data = await get(jp_fetch, "runs", str(run), "curves", metrics="no-such-metric")
    assert data["metrics"] == [] and data["names"] == ["loss", "acc", "val_loss"]


async def test_a_wide_run_shares_one_budget_of_points(jp_fetch, data_dir, monkeypatch):
    monkeypatch.setattr(server_curves, "MAX_SENT", 1000)
    s = RunStore()
    rid = s.start_run(world_size=8)
    s.add_metrics(rid, _rows(range(400), ranks=range(8)))
    s.end_run(rid, "ok")
    data = await get(jp_fetch, "runs", str(rid), "curves", points="2000", ranks="1")
    sent = sum(len(r["x"]) for m in data["metrics"] for r in m["ranks"])
    assert sent <= 1000 + 2 * 3 * 8  # (each line keeps its first and last)
    assert all(len(m["ranks"]) == 8 for m in data["metrics"])


async def test_past_8_ranks_a_metric_is_its_mean_band_and_outliers_alone(jp_fetch, data_dir):
    """64 ranks, rank 40's loss ten times the others': each metric's mean, the band of its 64
    ranks (their lowest to highest at each step) and the outlier ranks' lines alone, named; what
    is sent is bounded by the metrics, never by the ranks. A few ranks keep a line each."""
    s = RunStore()
    rid = s.start_run(name="wide", world_size=64)
    rows = _rows(range(300), ranks=range(64))
    for row in rows:
        if row["rank"] == 40:
            row["loss"] *= 10
    s.add_metrics(rid, rows)
    s.end_run(rid, "ok")
    data = await get(jp_fetch, "runs", str(rid), "curves", points="100", ranks="1")
    loss, acc, val = data["metrics"]
    assert loss["outliers"] == [40] and [r["rank"] for r in loss["ranks"]] == [40]
    assert loss["ranks"][0]["y"][0] == pytest.approx(23.0)  # rank 40's own line
    assert acc["outliers"] == [] and acc["ranks"] == []  # spread evenly: no outlier
    for m in (loss, acc, val):
        band = m["band"]
        assert band["ranks"] == 64
        for side in ("lo", "hi"):
            assert 2 <= len(band[side]["x"]) <= 100 and len(band[side]["x"]) == len(band[side]["y"])
    assert (loss["band"]["lo"]["y"][0], loss["band"]["hi"]["y"][0]) == pytest.approx((2.3, 23.0))
    assert (acc["band"]["lo"]["y"][0], acc["band"]["hi"]["y"][0]) == pytest.approx((0.0, 6.3))
    assert loss["band"]["hi"]["x"][-1] == 299  # the whole run
    sent = sum(
        len(line["x"])
        for m in data["metrics"]
        for line in (m["mean"], m["band"]["lo"], m["band"]["hi"], *m["ranks"])
    )
    assert sent <= 3 * (3 + 3) * 100  # mean, band, at most 3 outliers: 64 ranks or 256
    # without ranks=1, the mean alone, as before; and a few ranks keep every rank's line
    plain = await get(jp_fetch, "runs", str(rid), "curves", points="100")
    assert all(m["ranks"] == [] and "band" not in m for m in plain["metrics"])
    few = s.start_run(world_size=8)
    s.add_metrics(few, _rows(range(20), ranks=range(8)))
    s.end_run(few, "ok")
    data = await get(jp_fetch, "runs", str(few), "curves", points="100", ranks="1")
    assert all(len(m["ranks"]) == 8 and "band" not in m for m in data["metrics"])
    s.close()


async def test_a_live_run_is_read_once_in_pages_then_only_its_new_rows(
    jp_fetch, jp_serverapp, data_dir, monkeypatch
):
    series = _series(jp_serverapp)
    monkeypatch.setattr(series, "page", 1000)
    reads: list[tuple[int, int | None]] = []
    real = RunStore.metric_points

    def counting(self, run_id, since_id=0, limit=5000):
        rows = real(self, run_id, since_id, limit)
        reads.append((since_id, limit, len(rows)))
        return rows

    monkeypatch.setattr(RunStore, "metric_points", counting)
    s = RunStore()
    rid = s.start_run(world_size=2)
    s.add_metrics(rid, _rows(range(2500)))
    data = await get(jp_fetch, "runs", str(rid), "curves", points="100")
    assert data["complete"] and data["rows"] == 5000
    assert all(limit == 1000 for _, limit, _ in reads)  # bounded pages, never the whole run
    assert [n for *_, n in reads] == [1000] * 5 + [0]
    reads.clear()
    s.add_metrics(rid, _rows(range(2500, 2510), t0=0))
    data = await get(jp_fetch, "runs", str(rid), "curves", points="100")
    assert data["rows"] == 5020 and data["done"] == 2510
    assert [n for *_, n in reads] == [20]  # the new rows only
    assert reads[0][0] > 0
    s.close()


async def test_a_long_first_read_is_cut_and_says_so(jp_fetch, jp_serverapp, run, monkeypatch):
    series = _series(jp_serverapp)
    monkeypatch.setattr(series, "page", 500)
    monkeypatch.setattr(series, "budget", 0.0)  # one page per request
    first = await get(jp_fetch, "runs", str(run), "curves", points="100")
    assert (first["complete"], first["rows"]) == (False, 500)
    answers = [first]
    deadline = time.monotonic() + 30
    while not answers[-1]["complete"]:
        assert time.monotonic() < deadline, "the curves never caught up"
        answers.append(await get(jp_fetch, "runs", str(run), "curves", points="100"))
    assert answers[-1]["rows"] == 6000 and len(answers) == 13  # 12 pages, then none left


async def test_nonfinite_values_never_reach_the_json(jp_fetch, data_dir):
    s = RunStore()
    rid = s.start_run(world_size=1)
    rows = [
        {"time": 1.0, "rank": 0, "step": 0, "loss": float("nan"), "extra": {"acc": float("inf")}},
        {"time": 2.0, "rank": 0, "step": 1, "loss": 1.0, "extra": {"acc": 0.5, "note": "x"}},
        {"time": 3.0, "rank": 0, "step": 2, "loss": float("-inf"), "extra": {"acc": 0.75}},
    ]
    s.add_metrics(rid, rows)
    s.put_health(rid, [{"rank": 0, "time": time.time(), "cpu": float("nan"), "state": "ok"}])
    s.end_run(rid, "failed")
    data = await get(jp_fetch, "runs", str(rid), "curves", ranks="1")
    assert data["names"] == ["loss", "acc"]  # finite values only; no "note"
    means = {m["name"]: m["mean"] for m in data["metrics"]}
    assert means == {"acc": {"x": [1, 2], "y": [0.5, 0.75]}, "loss": {"x": [1], "y": [1.0]}}
    await get(jp_fetch, "runs", str(rid), "health", "history")  # parsed strictly
    s.close()


async def test_health_over_time_and_state_changes(jp_fetch, data_dir):
    s = RunStore()
    rid = s.start_run(world_size=2)
    started = s.get_run(rid)["started"]
    for i in range(40):
        s.put_health(
            rid,
            [
                {"rank": r, "time": started + i, "cpu": 50.0 + r, "rss": 1e8, "state": "ok"}
                for r in (0, 1)
            ],
        )
    s.put_health(rid, [{"rank": 1, "time": started + 40, "state": "failed"}])
    s.put_health(rid, [{"rank": 0, "time": started + 40, "state": "stopped"}])
    s.end_run(rid, "failed")
    data = await get(jp_fetch, "runs", str(rid), "health", "history", points="10")
    assert data["complete"] and data["measures"][:2] == ["cpu", "rss"]
    r0, r1 = data["ranks"]
    assert r1["states"] == [[pytest.approx(0.0), "ok"], [pytest.approx(40.0), "failed"]]
    assert r0["states"][-1][1] == "stopped"
    cpu = r1["measures"]["cpu"]
    assert 2 <= len(cpu["x"]) <= 10 and set(cpu["y"]) == {51.0}
    assert cpu["x"][0] == pytest.approx(0.0) and cpu["x"][-1] == pytest.approx(39.0)
    s.close()


async def test_points_are_capped_and_missing_runs_are_404(jp_fetch, run):
    code, message = await fetch_error(
        jp_fetch, "runs", str(run), "curves", params={"points": str(MAX_POINTS + 1)}
    )
    assert code == 400 and f"from 2 to {MAX_POINTS}" in message
    for parts in (("runs", "999", "curves"), ("runs", "999", "health", "history")):
        code, message = await fetch_error(jp_fetch, *parts)
        assert code == 404 and "no run '999'" in message and "\n" not in message


async def test_the_cache_keeps_a_bounded_number_of_runs(jp_fetch, jp_serverapp, data_dir):
    series = _series(jp_serverapp)
    s = RunStore()
    ids = []
    for _ in range(series.runs + 4):
        rid = s.start_run(world_size=1)
        s.add_metrics(rid, _rows(range(5), ranks=(0,)))
        s.end_run(rid, "ok")
        ids.append(rid)
    for rid in ids:
        data = await get(jp_fetch, "runs", str(rid), "curves")
        assert data["done"] == 5
    assert series.size() <= series.runs
    s.close()
