"""The run store's tables: ``SCHEMA``, its version, and what an earlier version's store gains.

A row's columns come from the records (``telemetry.events``): a metric row is
``events.METRIC_COLUMNS`` (plus the ``nonfinite`` name of a loss that is not a number), a health
row ``events.HEALTH_COLUMNS``, an event row ``events.EVENT_COLUMNS``; ``tests/unit/test_schema.py``
checks that the tables below have exactly these columns. A run's summary (``summaries``: each
metric's last, least and greatest mean over ranks) is what the runs list sorts by
(``listing``). A new column goes into ``SCHEMA`` and into ``ADDED_COLUMNS``, with
``SCHEMA_VERSION`` raised; an index on it, or what an old store's rows gain, into ``UPGRADES``.
How a record becomes a row, and what a column may hold, is ``rows``; the file these tables live
in, ``database``.
"""

from __future__ import annotations

import sqlite3

from .events import HEALTH_COLUMNS, RUN_DETAIL_FIELDS, RUN_FIELDS

#: The store's version (SQLite's ``user_version``). A store an earlier version made gains the
#: columns added since (``ADDED_COLUMNS``) when a writer next opens it; its readers find them
#: missing until then, and read them as None.
SCHEMA_VERSION = 4
#: Columns added after version 1, as (the version that added it, table, column, its SQL type).
#: Version 3's ``runs.listed``: whether the run is listed as a run (``listing``); every run an
#: older store holds stays listed. Version 4's ``data_share``: the share of a rank's steps spent
#: waiting for the next batch.
ADDED_COLUMNS = (
    (2, "health", "mesh", "TEXT"),
    (3, "runs", "listed", "INTEGER NOT NULL DEFAULT 1"),
    (4, "health", "data_share", "REAL"),
    (4, "health_samples", "data_share", "REAL"),
)
#: What a store older than the version gains once its columns are there, as (version, SQL): an
#: index on an added column (it cannot be in ``SCHEMA``, which an old store's tables skip), and
#: the summary an older run has (its last mean loss, the one the runs row kept).
UPGRADES = (
    (3, "CREATE INDEX IF NOT EXISTS runs_listed ON runs (listed, started)"),
    (
        3,
        "INSERT OR IGNORE INTO summaries (run_id, name, last)"
        " SELECT id, 'loss', loss FROM runs WHERE loss IS NOT NULL",
    ),
)
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
    kernel_pid INTEGER,
    listed INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS summaries (
    run_id INTEGER NOT NULL,
    name TEXT NOT NULL,
    last REAL,
    min REAL,
    max REAL,
    PRIMARY KEY (run_id, name)
);
CREATE INDEX IF NOT EXISTS summaries_name ON summaries (name);
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
    data_share REAL,
    heartbeat_age REAL,
    last_report_age REAL,
    mesh TEXT,
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
    comm_share REAL,
    data_share REAL
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


def upgrades(conn: sqlite3.Connection) -> list[str]:
    """What brings the store on ``conn`` (made by ``SCHEMA``) up to ``SCHEMA_VERSION``: the
    columns an earlier version's lacks, what it gains then (``UPGRADES``), and its new version;
    nothing for a store as new or newer. Read and run in one write transaction
    (``database.Database``)."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version >= SCHEMA_VERSION:
        return []
    missing = [
        f"ALTER TABLE {table} ADD COLUMN {column} {kind}"
        for _, table, column, kind in ADDED_COLUMNS
        if column not in {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
    ]
    gained = [sql for since, sql in UPGRADES if since > version]
    return [*missing, *gained, f"PRAGMA user_version = {SCHEMA_VERSION}"]


#: The run fields a writer may set (``RunStore.update_run``); the others are the store's own.
SETTABLE_RUN_FIELDS = tuple(
    f
    for f in (*RUN_FIELDS, *RUN_DETAIL_FIELDS)
    if f not in ("id", "started", "updated", "nonfinite", "kernel_pid", "listed")
)
#: The history of health samples keeps the verdict and the measures, not the host, the ages or
#: the mesh (the latest row has those).
HISTORY_COLUMNS = tuple(
    c for c in HEALTH_COLUMNS if c not in ("host", "heartbeat_age", "last_report_age", "mesh")
)
