"""The run store: every ``%%distributed`` run's options, metrics, health and events, in SQLite.

One file, ``data_dir()/runs.sqlite`` by default (``$NBDIST_DATA_DIR`` moves it), readable by its
owner only. WAL mode with short transactions and a busy timeout: the kernel writes while the
Jupyter server (another process) reads. Every reader returns plain, JSON-safe data: a loss that
is NaN or infinite comes back as ``None`` with ``nonfinite`` set to ``"nan"``, ``"inf"`` or
``"-inf"``.

Writers are used by the notebook's collector; readers by ``nbdist.runs()`` and the sidebar.
A ``RunStore`` may be shared by threads: each thread gets its own connection.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .. import config

#: A run still marked ``running`` whose writer has not touched it for this long is ``lost``.
LOST_AFTER = 60.0

_SCHEMA_VERSION = 1
_SCHEMA = """
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

_RUN_FIELDS = (
    "name", "label", "ended", "status", "cluster_id", "world_size", "step", "total", "loss",
    "samples_per_s", "options", "source", "failures",
)
_HEALTH_COLS = (
    "host", "state", "cpu", "rss", "gpu_util", "gpu_mem", "step_time", "comm_share",
    "heartbeat_age", "last_report_age",
)


def default_path() -> Path:
    """Where the run store lives: ``data_dir()/runs.sqlite``."""
    return config.data_dir() / "runs.sqlite"


def _split_loss(loss: Any) -> tuple[float | None, str | None]:
    """A loss as (finite value or None, ``nan``/``inf``/``-inf`` or None)."""
    if loss is None:
        return None, None
    loss = float(loss)
    if math.isnan(loss):
        return None, "nan"
    if math.isinf(loss):
        return None, "inf" if loss > 0 else "-inf"
    return loss, None


def _json(value: Any) -> str:
    return json.dumps(value, default=repr, allow_nan=False) if value is not None else "null"


def _safe(value: Any) -> Any:
    """JSON-safe copy: non-finite floats become their name as a string."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): _safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_safe(v) for v in value]
    return value


class RunStore:
    """The SQLite run store at ``path`` (default ``data_dir()/runs.sqlite``)."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else default_path()
        self._local = threading.local()
        self._ready = False

    # -- connection ---------------------------------------------------------------------------
    def _conn(self, create: bool) -> sqlite3.Connection | None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        if not create and not self.path.exists():
            return None
        if create:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            if not self.path.exists():  # owner-only from the first byte
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA busy_timeout = 10000")
        if create:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise sqlite3.OperationalError(f"cannot use WAL journal mode (got {mode})")
            conn.execute("PRAGMA synchronous = NORMAL")
            if not self._ready:
                conn.executescript(  # idempotent; one transaction
                    f"BEGIN IMMEDIATE;{_SCHEMA}PRAGMA user_version = {_SCHEMA_VERSION};COMMIT;"
                )
                self._ready = True
        self._local.conn = conn
        return conn

    def _w(self) -> sqlite3.Connection:
        return self._conn(create=True)

    def close(self) -> None:
        """Close this thread's connection (others close when their thread ends)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # -- writers ------------------------------------------------------------------------------
    def start_run(
        self,
        *,
        name: str = "",
        source: str = "",
        options: dict | None = None,
        cluster_id: str = "",
        world_size: int = 0,
        total: int | None = None,
        label: str = "",
        started: float | None = None,
    ) -> int:
        """Record a new run (status ``running``); return its id."""
        now = started or time.time()
        conn = self._w()
        with _tx(conn):
            cur = conn.execute(
                "INSERT INTO runs (name, label, started, updated, cluster_id, world_size, total,"
                " options, source, kernel_pid) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (name, label, now, now, cluster_id, world_size, total, _json(_safe(options or {})),
                 source, os.getpid()),
            )
        return int(cur.lastrowid)

    def update_run(self, run_id: int, **fields: Any) -> None:
        """Set some of a run's fields (step, total, loss, samples_per_s, status, label, ...)."""
        bad = set(fields) - set(_RUN_FIELDS)
        if bad:
            raise ValueError(f"unknown run fields: {sorted(bad)}")
        cols, vals = ["updated = ?"], [time.time()]
        for k, v in fields.items():
            if k == "loss":
                v, nonfinite = _split_loss(v)
                cols.append("nonfinite = ?")
                vals.append(nonfinite)
            elif k in ("options", "failures"):
                v = _json(_safe(v))
            cols.append(f"{k} = ?")
            vals.append(v)
        conn = self._w()
        with _tx(conn):
            conn.execute(f"UPDATE runs SET {', '.join(cols)} WHERE id = ?", (*vals, run_id))

    def end_run(self, run_id: int, status: str, failures: list | None = None,
                ended: float | None = None) -> None:
        """Close a run: its final status (ok, failed, interrupted, stopped) and failures."""
        self.update_run(run_id, status=status, ended=ended or time.time(),
                        failures=failures or [])

    def add_metrics(self, run_id: int, rows: Iterable[dict]) -> None:
        """Append metric rows: dicts with time, rank, step, loss, samples, extra."""
        data = []
        for r in rows:
            loss, nonfinite = _split_loss(r.get("loss"))
            extra = r.get("extra") or None
            data.append((run_id, r["time"], r["rank"], r.get("step"), loss, nonfinite,
                         r.get("samples"), _json(_safe(extra)) if extra else None))
        if not data:
            return
        conn = self._w()
        with _tx(conn):
            conn.executemany(
                "INSERT INTO metrics (run_id, time, rank, step, loss, nonfinite, samples, extra)"
                " VALUES (?,?,?,?,?,?,?,?)", data)

    def put_health(self, run_id: int, rows: Iterable[dict], history: bool = True) -> None:
        """Record each rank's latest health (dicts with rank, time and HEALTH columns)."""
        rows = list(rows)
        if not rows:
            return
        conn = self._w()
        cols = ("run_id", "rank", "time", *_HEALTH_COLS)
        with _tx(conn):
            conn.executemany(
                f"INSERT OR REPLACE INTO health ({', '.join(cols)}) "
                f"VALUES ({', '.join('?' * len(cols))})",
                [(run_id, r["rank"], r["time"], *(_num_or(r, c) for c in _HEALTH_COLS))
                 for r in rows])
            if history:
                conn.executemany(
                    "INSERT INTO health_samples (run_id, rank, time, state, cpu, rss, gpu_util,"
                    " gpu_mem, step_time, comm_share) VALUES (?,?,?,?,?,?,?,?,?,?)",
                    [(run_id, r["rank"], r["time"], r.get("state") or "ok", r.get("cpu"),
                      r.get("rss"), r.get("gpu_util"), r.get("gpu_mem"), r.get("step_time"),
                      r.get("comm_share")) for r in rows])
            conn.execute("UPDATE runs SET updated = ? WHERE id = ?", (time.time(), run_id))

    def add_event(self, run_id: int, kind: str, rank: int | None = None, message: str = "",
                  data: dict | None = None, at: float | None = None) -> None:
        """Append one event (a worker died, a restart, a checkpoint, a NaN loss, ...)."""
        self.add_events(run_id, [{"time": at or time.time(), "kind": kind, "rank": rank,
                                  "message": message, "data": data}])

    def add_events(self, run_id: int, rows: Iterable[dict]) -> None:
        """Append events: dicts with time, kind, rank, message, data."""
        data = [(run_id, r["time"], r["kind"], r.get("rank"), str(r.get("message") or ""),
                 _json(_safe(r["data"])) if r.get("data") else None) for r in rows]
        if not data:
            return
        conn = self._w()
        with _tx(conn):
            conn.executemany(
                "INSERT INTO events (run_id, time, kind, rank, message, data)"
                " VALUES (?,?,?,?,?,?)", data)

    def touch(self, run_id: int) -> None:
        """Say that the writer of a running run is still alive."""
        conn = self._w()
        with _tx(conn):
            conn.execute("UPDATE runs SET updated = ? WHERE id = ?", (time.time(), run_id))

    def delete_run(self, run_id: int) -> None:
        """Forget a run and everything recorded about it."""
        conn = self._w()
        with _tx(conn):
            for table in ("metrics", "health", "health_samples", "events"):
                conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))

    # -- readers ------------------------------------------------------------------------------
    def _read(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        conn = self._conn(create=False)
        if conn is None:
            return []
        try:
            return conn.execute(sql, args).fetchall()
        except sqlite3.OperationalError as e:
            if "no such table" in str(e):  # a file another process is still creating
                return []
            raise

    def list_runs(self, limit: int = 100) -> list[dict]:
        """The latest runs, newest first."""
        rows = self._read("SELECT * FROM runs ORDER BY id DESC LIMIT ?", (int(limit),))
        return [_run(r) for r in rows]

    def get_run(self, run_id: int) -> dict | None:
        """One run with its options, source and failures; None if there is no such run."""
        rows = self._read("SELECT * FROM runs WHERE id = ?", (int(run_id),))
        return _run(rows[0], full=True) if rows else None

    def metrics(self, run_id: int, since_id: int = 0) -> list[dict]:
        """A run's metric rows after ``since_id`` (for polling), oldest first."""
        rows = self._read(
            "SELECT id, time, rank, step, loss, nonfinite, samples, extra FROM metrics"
            " WHERE run_id = ? AND id > ? ORDER BY id", (int(run_id), int(since_id)))
        return [
            {"id": r["id"], "time": r["time"], "rank": r["rank"], "step": r["step"],
             "loss": r["loss"], "nonfinite": r["nonfinite"], "samples": r["samples"],
             "extra": json.loads(r["extra"]) if r["extra"] else {}}
            for r in rows
        ]

    def health(self, run_id: int) -> list[dict]:
        """Each rank's latest health, by rank."""
        rows = self._read("SELECT * FROM health WHERE run_id = ? ORDER BY rank", (int(run_id),))
        return [{k: r[k] for k in ("rank", "time", *_HEALTH_COLS)} for r in rows]

    def health_history(self, run_id: int, since_id: int = 0) -> list[dict]:
        """Every health sample recorded for a run, oldest first."""
        rows = self._read("SELECT * FROM health_samples WHERE run_id = ? AND id > ? ORDER BY id",
                          (int(run_id), int(since_id)))
        return [{k: r[k] for k in r.keys() if k != "run_id"} for r in rows]

    def events(self, run_id: int) -> list[dict]:
        """A run's events, oldest first."""
        rows = self._read("SELECT * FROM events WHERE run_id = ? ORDER BY id", (int(run_id),))
        return [
            {"id": r["id"], "time": r["time"], "kind": r["kind"], "rank": r["rank"],
             "message": r["message"], "data": json.loads(r["data"]) if r["data"] else {}}
            for r in rows
        ]


class _tx:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error): short write transactions."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def __enter__(self):
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.conn.execute("COMMIT")
        elif self.conn.in_transaction:  # SQLite may have rolled back already (a full disk)
            self.conn.execute("ROLLBACK")
        return False


def _num_or(r: dict, col: str) -> Any:
    v = r.get(col)
    if col in ("host", "state"):
        return str(v) if v is not None else ("ok" if col == "state" else "")
    return v if v is None or (isinstance(v, (int, float)) and math.isfinite(v)) else None


def _run(r: sqlite3.Row, full: bool = False) -> dict:
    status = r["status"]
    if status == "running" and time.time() - r["updated"] > LOST_AFTER:
        status = "lost"
    out = {
        "id": r["id"], "name": r["name"], "label": r["label"], "started": r["started"],
        "ended": r["ended"], "updated": r["updated"], "status": status,
        "cluster_id": r["cluster_id"], "world_size": r["world_size"], "step": r["step"],
        "total": r["total"], "loss": r["loss"], "nonfinite": r["nonfinite"],
        "samples_per_s": r["samples_per_s"],
    }
    out["options"] = json.loads(r["options"] or "{}")
    if full:
        out["source"] = r["source"]
        out["failures"] = json.loads(r["failures"] or "[]")
        out["kernel_pid"] = r["kernel_pid"]
    return out


class StoreWriter:
    """A run's writes, made from a background thread: one short transaction per kind and interval.

    The training never waits for the disk. When the store cannot be written (a read-only
    directory, a full disk), ``error`` says why and every later write is dropped: the caller
    shows one warning and the run goes on.
    """

    def __init__(self, store: RunStore, interval: float = 0.5):
        self.store = store
        self.interval = interval
        self.error: str | None = None
        self._ops: deque = deque()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None

    def start_run(self, **fields: Any) -> int | None:
        """Record the run now (its id is needed at once); None when the store is unwritable."""
        try:
            run_id = self.store.start_run(**fields)
        except (sqlite3.Error, OSError) as e:
            self.error = f"{type(e).__name__}: {e}"
            return None
        self._thread = threading.Thread(target=self._loop, name="nbdist-store", daemon=True)
        self._thread.start()
        return run_id

    def put(self, method: str, *args: Any, **kwargs: Any) -> None:
        """Queue ``store.<method>(*args, **kwargs)``; consecutive row appends are merged."""
        if self.error is None and self._thread is not None:
            self._ops.append((method, args, kwargs))

    def _loop(self) -> None:
        while not self._stop:
            self._wake.wait(self.interval)
            self._flush()
        self._flush()

    def _flush(self) -> None:
        ops = [self._ops.popleft() for _ in range(len(self._ops))]
        merged: list = []
        for method, args, kwargs in ops:  # one executemany per run of appends
            last = merged[-1] if merged else None
            if (last and method in ("add_metrics", "put_health", "add_events")
                    and last[0] == method and last[1][0] == args[0] and not kwargs):
                last[1][1].extend(args[1])
            elif method in ("add_metrics", "put_health", "add_events"):
                merged.append((method, [args[0], list(args[1])], kwargs))
            else:
                merged.append((method, list(args), kwargs))
        for method, args, kwargs in merged:
            if self.error is not None:
                return
            try:
                getattr(self.store, method)(*args, **kwargs)
            except (sqlite3.Error, OSError) as e:
                self.error = f"{type(e).__name__}: {e}"

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued and stop the thread."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
