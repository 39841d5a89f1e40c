"""One schema: the telemetry records, the run store's tables and readers (what the sidebar's
endpoints send as is), and the sidebar's TypeScript types all use the same names."""

from __future__ import annotations

import dataclasses
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT

from nbdist import protocol
from nbdist.config import CellOptions
from nbdist.errors import RankFailure
from nbdist.telemetry import events as ev
from nbdist.telemetry import tables
from nbdist.telemetry.store import RunStore

API_TS = ROOT / "extension" / "src" / "api.ts"


# -- api.ts, read as a reader would -----------------------------------------------------------
def _interfaces(text: str) -> dict[str, dict[str, str]]:
    """``export interface X [extends Y] { name[?]: type; ... }`` -> {X: {name: type}}, with
    the fields of ``Y`` included."""
    found: dict[str, tuple[str | None, dict[str, str]]] = {}
    pattern = r"export interface (\w+)(?: extends (\w+))? \{\n(.*?)\n\}"
    for name, base, body in re.findall(pattern, text, re.S):
        fields = re.findall(r"^\s*(\w+)\??: (.+);$", body, re.M)
        found[name] = (base or None, dict(fields))

    def resolve(name: str) -> dict[str, str]:
        base, fields = found[name]
        return {**(resolve(base) if base else {}), **fields}

    return {name: resolve(name) for name in found}


def _unions(text: str) -> dict[str, tuple[str, ...]]:
    """``export type X = 'a' | 'b';`` -> {X: ("a", "b")}."""
    return {
        name: tuple(re.findall(r"'([^']*)'", body))
        for name, body in re.findall(r"export type (\w+) = ([^;]+);", text)
    }


@pytest.fixture(scope="module")
def ts() -> dict[str, dict[str, str]]:
    return _interfaces(API_TS.read_text())


def test_the_parser_reads_api_ts(ts):
    assert {
        "IEngine",
        "ICluster",
        "IRun",
        "IRunDetail",
        "IMetric",
        "IWorker",
        "IEvent",
        "IFailure",
    } <= set(ts)
    assert ts["IRun"]["ended"] == "number | null"
    assert set(ts["IRun"]) < set(ts["IRunDetail"])  # extends: the base's fields are in


def test_the_type_unions_are_the_python_vocabularies():
    unions = _unions(API_TS.read_text())
    assert unions["RunStatus"] == ev.RUN_STATUSES
    assert unions["WorkerState"] == ev.STATES


# -- the store's rows, from the records ---------------------------------------------------------
def test_store_columns_come_from_the_records():
    assert set(ev.METRIC_COLUMNS) == {"rank", *ev.MetricRecord._fields} - {"total"}
    assert "total" in ev.RUN_FIELDS  # a record's total goes to its run
    assert ev.HEALTH_COLUMNS == tuple(f.name for f in dataclasses.fields(ev.WorkerHealth))
    measured = {"host", "cpu", "rss", "gpu_util", "gpu_mem", "step_time", "comm_share"}
    assert measured <= {f.name for f in dataclasses.fields(ev.HealthSample)}
    assert measured <= set(ev.HEALTH_COLUMNS)
    assert set(ev.EventRecord._fields) | {"rank"} == set(ev.EVENT_COLUMNS)


def test_the_tables_have_exactly_those_columns(tmp_path):
    store = RunStore(tmp_path / "runs.sqlite")
    store.start_run()
    with sqlite3.connect(store.path) as c:
        cols = {
            t: {r[1] for r in c.execute(f"PRAGMA table_info({t})")}
            for t in ("runs", "metrics", "health", "health_samples", "events")
        }
    assert cols["runs"] == {*ev.RUN_FIELDS, *ev.RUN_DETAIL_FIELDS}
    assert cols["metrics"] == {"id", "run_id", *ev.METRIC_COLUMNS, "nonfinite"}
    assert cols["health"] == {"run_id", *ev.HEALTH_COLUMNS}
    assert cols["health_samples"] == {"id", "run_id", *tables.HISTORY_COLUMNS}
    assert cols["events"] == {"id", "run_id", *ev.EVENT_COLUMNS}


@pytest.fixture
def rows(tmp_path) -> dict:
    """One of each thing the endpoints send, read from a store the kernel's way wrote."""
    from nbdist.notebook.run.observers.assembly import assemble
    from nbdist.notebook.run.observers.store import RunRecord

    store = RunStore(tmp_path / "runs.sqlite")
    watch = assemble("x = 1", CellOptions(dashboard=False), [0], cluster_id="c", store_at=store)
    writer = watch.find(RunRecord).writer
    writer.add_metrics(watch.run_id, 0, [ev.MetricRecord(1.0, 0, 0.5, 8, 1, None)])
    writer.put_health(watch.run_id, [ev.WorkerHealth(rank=0, time=1.0)])
    watch.close("failed", [RankFailure(0, "boom", at=1.0, kind="error")])
    rid = watch.run_id
    return {
        "IRun": store.list_runs()[0],
        "IRunDetail": store.get_run(rid),
        "IFailure": store.get_run(rid)["failures"][0],
        "IMetric": store.metrics(rid)[0],
        "IWorker": store.health(rid)[0],
        "IEvent": store.events(rid)[0],
    }


def test_the_sidebars_types_name_what_the_store_sends(ts, rows):
    for interface, row in rows.items():
        assert set(ts[interface]) == set(row), interface
    assert set(ts["IRun"]) == {*ev.RUN_FIELDS, *ev.RUN_DERIVED}
    assert set(ts["IRunDetail"]) == {*ev.RUN_FIELDS, *ev.RUN_DERIVED, *ev.RUN_DETAIL_FIELDS}
    assert set(ts["IMetric"]) == {"id", *ev.METRIC_COLUMNS, "nonfinite"}
    assert set(ts["IWorker"]) == set(ev.HEALTH_COLUMNS)
    assert set(ts["IEvent"]) == {"id", *ev.EVENT_COLUMNS}


def test_the_cluster_types_name_what_the_server_sends(ts):
    from nbdist.server import clusters

    entry = clusters._entry(
        cluster_id="c",
        owner="sidebar",
        state="failed",
        pid=1,
        n=1,
        started=0.0,
        backend="gloo",
        engines=[clusters._engine(1, 0)],
        error="why",
    )
    assert set(ts["ICluster"]) == set(entry)
    assert set(ts["IEngine"]) == set(entry["engines"][0])


# -- the records on the wire ----------------------------------------------------------------------
def test_protocol_re_exports_the_telemetry_records():
    for name in ("Batch", "MetricRecord", "HealthSample", "EventRecord"):
        assert getattr(protocol, name) is getattr(ev, name)


def test_a_batch_survives_ipyparallels_serialisation():
    from ipyparallel.serialize import deserialize_object, serialize_object

    batch = ev.Batch(
        1,
        7,
        2.0,
        [ev.MetricRecord(1.0, 3, 0.25, 8, 10, {"lr": 0.1})],
        ev.HealthSample(1.5, "h", 42, cpu=12.5, reports=4),
        [ev.EventRecord(1.2, "checkpoint", "step 3", {"step": 3})],
    )
    back, _ = deserialize_object(serialize_object({ev.key(42, 7): batch}))
    got = back[ev.key(42, 7)]
    assert got == batch and type(got.metrics[0]) is ev.MetricRecord and got.v == ev.VERSION


def test_the_schema_and_the_kernel_side_import_no_torch():
    code = (
        "import sys\n"
        "import nbdist.protocol, nbdist.telemetry.events\n"
        "light = sorted(m for m in ('torch', 'numpy') if m in sys.modules)\n"
        "import nbdist.telemetry.store, nbdist.telemetry.writer, nbdist.notebook.board.collector\n"
        "import nbdist.notebook.run.observers.assembly, nbdist.notebook.board.runs\n"
        "import nbdist.notebook.board.dashboard\n"
        "print(light, 'torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[] False"


def test_every_event_kind_nbdist_sends_is_declared():
    """An event kind used anywhere in nbdist (``event("sync", ...)``, ``on_event("restart", ...)``)
    is one of ``EVENT_KINDS``, the list the store and the sidebar document."""
    import ast

    import nbdist
    from nbdist.telemetry.events import EVENT_KINDS

    used = set()
    for path in Path(nbdist.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = getattr(node.func, "attr", getattr(node.func, "id", None))
            first = node.args[0]
            if name in ("event", "on_event") and isinstance(first, ast.Constant):
                used.add((first.value, path.name))
    assert used, "no event call found: the test no longer sees them"
    assert [u for u in used if u[0] not in EVENT_KINDS] == []
