"""The run store's tables, and the typed records (``events``) as the rows that go in.

The column lists come from the records: a metric row is ``events.METRIC_COLUMNS`` (plus the
``nonfinite`` name of a loss that is not a number), a health row ``events.HEALTH_COLUMNS``, an
event row ``events.EVENT_COLUMNS``. ``tests/unit/test_schema.py`` checks that the tables below have
exactly these columns. Values are stored JSON-safe: a NaN or infinite number is never written.
"""

from __future__ import annotations

import json
import math
from typing import Any

from .events import (
    EVENT_COLUMNS,
    HEALTH_COLUMNS,
    METRIC_COLUMNS,
    RUN_DETAIL_FIELDS,
    RUN_FIELDS,
    MetricRecord,
    RunEvent,
    WorkerHealth,
)

SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL DEFAULT '',
    label TEXT NOT NULL DEFAULT '',
    started REAL NOT NULL,
    ended REAL,
    updated REAL NOT NULL,
    status TEXT NOT NULL DEFAULT 'running',
    cluster_id TEXT NOT NULL DEFAULT '',
    world_size INTEGER NOT NULL DEFAULT 0,
    step INTEGER,
    total INTEGER,
    loss REAL,
    nonfinite TEXT,
    samples_per_s REAL,
    options TEXT NOT NULL DEFAULT '{}',
    source TEXT NOT NULL DEFAULT '',
    failures TEXT NOT NULL DEFAULT '[]',
    kernel_pid INTEGER
);
CREATE TABLE IF NOT EXISTS metrics (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id INTEGER NOT NULL,
    time REAL NOT NULL,
    rank INTEGER NOT NULL,
    step INTEGER,
    loss REAL,
    nonfinite TEXT,
    samples REAL,
    extra TEXT
);
CREATE INDEX IF NOT EXISTS metrics_run ON metrics (run_id, id);
CREATE TABLE IF NOT EXISTS health (
    run_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    time REAL NOT NULL,
    host TEXT NOT NULL DEFAULT '',
    state TEXT NOT NULL DEFAULT 'ok',
    cpu REAL,
    rss REAL,
    gpu_util REAL,
    gpu_mem REAL,
    step_time REAL,
    comm_share REAL,
    heartbeat_age REAL,
    last_report_age REAL,
    PRIMARY KEY (run_id, rank)
);
CREATE TABLE IF NOT EXISTS health_samples (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    time REAL NOT NULL,
    state TEXT NOT NULL,
    cpu REAL,
    rss REAL,
    gpu_util REAL,
    gpu_mem REAL,
    step_time REAL,
    comm_share REAL
);
CREATE INDEX IF NOT EXISTS health_samples_run ON health_samples (run_id, id);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id INTEGER NOT NULL,
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    rank INTEGER,
    message TEXT NOT NULL DEFAULT '',
    data TEXT
);
CREATE INDEX IF NOT EXISTS events_run ON events (run_id, id);
"""

#: The run fields a writer may set (``RunStore.update_run``); the others are the store's own.
SETTABLE_RUN_FIELDS = tuple(
    f
    for f in (*RUN_FIELDS, *RUN_DETAIL_FIELDS)
    if f not in ("id", "started", "updated", "nonfinite", "kernel_pid")
)
#: The history of health samples keeps the verdict and the measures, not the host or the ages.
HISTORY_COLUMNS = tuple(
    c for c in HEALTH_COLUMNS if c not in ("host", "heartbeat_age", "last_report_age")
)


def _insert(table: str, columns: tuple[str, ...], verb: str = "INSERT") -> str:
    return (
        f"{verb} INTO {table} (run_id, {', '.join(columns)}) "
        f"VALUES ({', '.join('?' * (len(columns) + 1))})"
    )


INSERT_METRIC = _insert("metrics", (*METRIC_COLUMNS, "nonfinite"))
INSERT_HEALTH = _insert("health", HEALTH_COLUMNS, "INSERT OR REPLACE")
INSERT_HISTORY = _insert("health_samples", HISTORY_COLUMNS)
INSERT_EVENT = _insert("events", EVENT_COLUMNS)


# -- values ---------------------------------------------------------------------------------------
def split_loss(loss: Any) -> tuple[float | None, str | None]:
    """A loss as (finite value or None, ``nan``/``inf``/``-inf`` or None)."""
    if loss is None:
        return None, None
    loss = float(loss)
    if math.isnan(loss):
        return None, "nan"
    if math.isinf(loss):
        return None, "inf" if loss > 0 else "-inf"
    return loss, None


def json_safe(value: Any) -> Any:
    """JSON-safe copy: non-finite floats become their name as a string."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def to_json(value: Any) -> str:
    """``value`` as JSON text for a TEXT column: non-finite numbers as their names. (The common
    case, finite numbers only, is encoded at once: a metric row's extras, many a second.)"""
    try:
        return json.dumps(value, allow_nan=False)
    except (ValueError, TypeError):  # NaN or inf, or what JSON has no word for: made safe
        return json.dumps(json_safe(value), default=repr, allow_nan=False)


def _finite_or_none(v: Any) -> Any:
    return v if v is None or (isinstance(v, (int, float)) and math.isfinite(v)) else None


# -- rows -----------------------------------------------------------------------------------------
def metric_row(run_id: int, rank: int, rec: MetricRecord) -> tuple:
    """``rec`` from ``rank`` as values for ``INSERT_METRIC``."""
    loss, nonfinite = split_loss(rec.loss)
    values = {
        "time": rec.time,
        "rank": rank,
        "step": rec.step,
        "loss": loss,
        "samples": rec.samples,
        "extra": to_json(rec.extra) if rec.extra else None,
    }
    return (run_id, *(values[c] for c in METRIC_COLUMNS), nonfinite)


def metric_from_dict(row: dict[str, Any]) -> tuple[int, MetricRecord]:
    """A metric row given as a dict (``rank`` and the record's fields) as (rank, record)."""
    return row["rank"], MetricRecord(row["time"], *(row.get(f) for f in MetricRecord._fields[1:]))


def _health_values(h: WorkerHealth) -> dict[str, Any]:
    """``h``'s columns, stored safely: text never NULL, non-finite measures as NULL."""
    out = {c: _finite_or_none(getattr(h, c)) for c in HEALTH_COLUMNS}
    out.update(rank=h.rank, time=h.time, host=str(h.host or ""), state=str(h.state or "ok"))
    return out


def health_row(run_id: int, h: WorkerHealth) -> tuple:
    """``h`` as values for ``INSERT_HEALTH``."""
    values = _health_values(h)
    return (run_id, *(values[c] for c in HEALTH_COLUMNS))


def history_row(run_id: int, h: WorkerHealth) -> tuple:
    """``h`` as values for ``INSERT_HISTORY``."""
    values = _health_values(h)
    return (run_id, *(values[c] for c in HISTORY_COLUMNS))


def event_from_dict(row: dict[str, Any]) -> RunEvent:
    """An event given as a dict (time, kind and maybe rank, message, data)."""
    return RunEvent(
        row["time"], row["kind"], row.get("rank"), row.get("message") or "", row.get("data")
    )


def event_row(run_id: int, e: RunEvent) -> tuple:
    """``e`` as values for ``INSERT_EVENT``: the message as text, the data as JSON."""
    values = e._replace(message=str(e.message or ""), data=to_json(e.data) if e.data else None)
    return (run_id, *values)
