"""Which cells are runs, and a page of them found: the store's listing rule and its queries.

A run is a cell that reported, checkpointed, was named or failed; other cells are kept, listed
only when asked (``all``). A store of an earlier version is read as it is (every run listed)
and, once a writer opens it, keeps every run listed and its runs' last loss as their summary.
Pages are disjoint and complete, search is by a part of the name in any case (``%`` and ``_``
are plain characters), statuses include ``lost``, and any summary metric sorts, runs without it
last. A bad query is one line that names the valid values.
"""

from __future__ import annotations

import re
import sqlite3
import time

import pytest

from nbdist.config import CellOptions
from nbdist.errors import UsageError
from nbdist.telemetry import store as store_mod
from nbdist.telemetry import tables
from nbdist.telemetry.events import Batch, MetricRecord
from nbdist.telemetry.listing import RunQuery
from nbdist.telemetry.store import RunStore


def _ended(s: RunStore, status: str = "ok", name: str = "", **what) -> int:
    rid = s.start_run(name=name)
    if what.get("metric"):
        s.add_metrics(rid, [{"time": 1.0, "rank": 0, "step": 0, "loss": what["metric"]}])
    if what.get("checkpoint"):
        s.add_event(rid, "checkpoint", message="checkpoint of step 3 written")
    if what.get("summary"):
        s.put_summary(rid, what["summary"])
    s.end_run(rid, status)
    return rid


def _ids(s: RunStore, **query) -> list[int]:
    return [r["id"] for r in s.find_runs(RunQuery(**query))[0]]


def test_a_run_is_a_cell_that_reported_checkpointed_was_named_or_failed(tmp_path):
    s = RunStore(tmp_path / "runs.sqlite")
    plain = _ended(s)  # print("hi"): a cell of the session
    stopped = _ended(s, "interrupted")  # interrupted before it did anything
    named = _ended(s, name="cnn-lr0.05")
    reported = _ended(s, metric=0.5)
    summarised = _ended(s, summary={"acc": (0.9, 0.1, 0.9)})
    saved = _ended(s, "interrupted", checkpoint=True)
    failed = _ended(s, "failed")
    live = s.start_run()  # not ended: listed while it runs
    runs, total = s.find_runs(RunQuery())
    assert [r["id"] for r in runs] == [live, failed, saved, summarised, reported, named]
    assert total == 6 and all(r["listed"] for r in runs)
    every, total = s.find_runs(RunQuery(all=True))
    assert total == 8 and [r["id"] for r in every][-2:] == [stopped, plain]
    assert not s.get_run(plain)["listed"] and not s.get_run(stopped)["listed"]
    assert len(s.list_runs()) == 8  # housekeeping still sees every cell


def test_a_store_of_the_previous_version_keeps_every_run_listed(tmp_path):
    path = tmp_path / "runs.sqlite"
    old = tables.SCHEMA.replace(",\n    listed INTEGER NOT NULL DEFAULT 1", "")
    old = old.replace("    data_share REAL,\n", "").replace(",\n    data_share REAL", "")
    old = re.sub(
        r"CREATE TABLE IF NOT EXISTS summaries.*?ON summaries \(name\);", "", old, flags=re.S
    )
    assert "listed" not in old and "summaries" not in old and "data_share" not in old
    with sqlite3.connect(path) as c:
        c.executescript(f"{old}PRAGMA user_version = 2;")
        for i, loss in enumerate((0.3, None, 0.1)):
            c.execute(
                "INSERT INTO runs (started, updated, status, loss) VALUES (?, ?, 'ok', ?)",
                (float(i), float(i), loss),
            )
    reader = RunStore(path)  # as the Jupyter server reads it: nothing written
    assert _ids(reader) == [3, 2, 1] and _ids(reader, sort="loss") == [3, 1, 2]
    assert _ids(reader, sort="min:loss") == [3, 2, 1]  # not kept yet: the newest first
    assert reader.find_runs(RunQuery())[0][0]["listed"] is True
    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == 2

    writer = RunStore(path)
    writer.end_run(writer.start_run(), "ok")  # a plain cell, after the upgrade
    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == tables.SCHEMA_VERSION == 4
        indices = {r[1] for r in c.execute("PRAGMA index_list(runs)")}
        assert "runs_listed" in indices
    assert _ids(writer) == [3, 2, 1]  # the old runs stay listed; the new cell is not
    assert writer.get_run(1)["summary"] == {"loss": {"last": 0.3, "min": None, "max": None}}
    assert _ids(writer, sort="loss") == [3, 1, 2]
    plan = writer.read(
        "EXPLAIN QUERY PLAN SELECT * FROM runs WHERE listed = 1 ORDER BY started DESC LIMIT 20"
    )
    assert "runs_listed" in " ".join(str(tuple(r)) for r in plan)


def test_pages_are_disjoint_and_complete_and_the_total_is_every_match(tmp_path):
    s = RunStore(tmp_path / "runs.sqlite")
    made = [_ended(s, name=f"run-{i}") for i in range(23)]
    _ended(s)  # a plain cell: in no page
    seen = []
    for offset in range(0, 30, 10):
        runs, total = s.find_runs(RunQuery(offset=offset, limit=10))
        assert total == 23
        seen += [r["id"] for r in runs]
    assert seen == made[::-1]


def test_search_is_by_a_part_of_the_name_in_any_case(tmp_path):
    s = RunStore(tmp_path / "runs.sqlite")
    cnn = _ended(s, name="CNN-lr0.05")
    mlp = _ended(s, name="mlp_100%")
    _ended(s, name="mlpx100")
    trial = s.start_run(label="trial 3: lr=0.1")
    assert _ids(s, name="cnn") == [cnn] and _ids(s, name="LR0.0") == [cnn]
    assert _ids(s, name="p_1") == [mlp] and _ids(s, name="0%") == [mlp]  # not wildcards
    assert _ids(s, name="lr=0.1") == [trial]  # a sweep's trial, by its label
    assert s.find_runs(RunQuery(name="nothing"))[1] == 0


def test_status_filters_read_a_vanished_writers_run_as_lost(tmp_path, monkeypatch):
    s = RunStore(tmp_path / "runs.sqlite")
    ok, failed = _ended(s, name="a"), _ended(s, "failed")
    running = s.start_run(name="live")
    assert _ids(s, status=("running",)) == [running]
    assert _ids(s, status="ok,failed") == [failed, ok]
    monkeypatch.setattr(store_mod, "LOST_AFTER", -1.0)
    assert _ids(s, status=("running",)) == [] and _ids(s, status=("lost",)) == [running]
    assert _ids(s, sort="status") == [failed, running, ok]  # failed < lost < ok


def test_any_summary_metric_sorts_both_ways_runs_without_it_last(tmp_path):
    s = RunStore(tmp_path / "runs.sqlite")
    a = _ended(s, name="a", summary={"loss": (0.5, 0.2, 2.0), "acc": (0.7, 0.1, 0.8)})
    b = _ended(s, name="b", summary={"loss": (0.3, 0.3, 1.0)})
    c = _ended(s, name="c", summary={"loss": (0.9, 0.1, 3.0), "acc": (0.9, 0.2, 0.9)})
    none = _ended(s, name="d")
    assert _ids(s, sort="loss") == [b, a, c, none]
    assert _ids(s, sort="last:loss", order="desc") == [c, a, b, none]
    assert _ids(s, sort="min:loss") == [c, a, b, none]
    assert _ids(s, sort="max:acc", order="desc") == [c, a, none, b]  # then the newest
    assert _ids(s, sort="name", order="desc") == [none, c, b, a]
    assert _ids(s, sort="time") == [none, c, b, a]
    assert s.metric_names() == ["loss", "acc"]
    assert s.find_runs(RunQuery(sort="acc"))[0][0]["summary"]["acc"] == {
        "last": 0.7,
        "min": 0.1,
        "max": 0.8,
    }


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ({"status": ("done",)}, "use running, ok, failed, interrupted, stopped, lost"),
        ({"status": "ok,nope"}, "'nope' is not a run's status"),
        ({"sort": "min:"}, "names no metric: use min:loss"),
        ({"sort": ""}, "sort takes time, duration, name, status, step, or a metric"),
        ({"order": "up"}, "order takes asc or desc"),
        ({"limit": 0}, "limit takes a whole number from 1 to 100000"),
        ({"offset": -1}, "offset takes a whole number"),
        ({"name": "x" * 201}, "name takes a part of a run's name"),
    ],
)
def test_a_bad_query_is_one_line_naming_the_valid_values(query, words):
    with pytest.raises(UsageError) as e:
        RunQuery(**query)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_the_runs_record_keeps_each_metrics_last_least_and_greatest_mean(tmp_path):
    """The kernel's way: records from two ranks, folded by the run's watch, summarised by its
    store observer from the settled means (one a step), written by the run's end."""
    from nbdist.notebook.run.observers.assembly import assemble

    s = RunStore(tmp_path / "runs.sqlite")
    watch = assemble("train()", CellOptions(dashboard=False), [0, 1], store_at=s)
    losses = {0: [4.0, 1.0, 3.0], 1: [2.0, 1.0, 1.0]}  # means 3, 1, 2
    now = time.time()
    for rank, values in losses.items():
        recs = [
            MetricRecord(now + i, i, v, None, None, {"acc": 0.25 * (i + rank)})
            for i, v in enumerate(values)
        ]
        watch.collector.ingest(rank, Batch(rank, 1, now, recs))
    watch.close("ok")
    run = s.get_run(watch.run_id)
    assert run["listed"] and run["loss"] == 2.0
    assert run["summary"] == {
        "loss": {"last": 2.0, "min": 1.0, "max": 3.0},
        "acc": {"last": 0.625, "min": 0.125, "max": 0.625},
    }
    quiet = assemble("print('hi')", CellOptions(dashboard=False), [0, 1], store_at=s)
    quiet.close("ok")
    assert not s.get_run(quiet.run_id)["listed"] and s.get_run(quiet.run_id)["summary"] == {}


def test_nbdist_runs_shows_names_and_says_how_many_there_are(tmp_path):
    from nbdist.notebook.board.runs import runs

    s = RunStore(tmp_path / "runs.sqlite")
    for i in range(25):
        name = f"cnn-lr0.{i:02d}" if i % 2 else ""
        _ended(s, "failed" if i % 5 == 0 else "ok", name=name, metric=1.0 / (i + 1))
    _ended(s)  # a plain cell
    shown = runs(store=s)
    text = repr(shown)
    assert len(shown) == 20 and shown.total == 25
    assert text.splitlines()[0] == (
        "showing 20 of 25 runs; runs(limit=...), runs(name=...) or runs(status=...) for others"
    )
    assert text.splitlines()[1].split()[:3] == ["id", "name", "status"]
    assert "cnn-lr0.23" in text.splitlines()[3]
    named = runs(name="LR0.1", store=s)
    assert [r["name"] for r in named] == [f"cnn-lr0.{i}" for i in (19, 17, 15, 13, 11)]
    assert not repr(named).startswith("showing")  # all of them shown
    assert {r["status"] for r in runs(status="failed", store=s)} == {"failed"}
    assert len(runs(status=["ok", "failed"], limit=100, store=s)) == 25
    assert len(runs(all=True, limit=100, store=s)) == 26
    assert repr(runs(name="zzz", store=s)) == (
        "no runs with name 'zzz'; runs() lists the latest of every name"
    )
    with pytest.raises(UsageError, match="status 'done' is not a run's status: use running, ok"):
        runs(status="done", store=s)
    with pytest.raises(UsageError, match="limit takes a whole number from 1 to 100000"):
        runs(0, store=s)
