"""The run store's file: where it is, how it is opened, and its short write transactions.

One file, ``data_dir()/runs.sqlite`` by default (``$NBDIST_DATA_DIR`` moves it), readable by its
owner only, in a data folder checked to be the user's own (``datadir``: a reader creates nothing,
and finds no store where none was written). WAL mode with short transactions and a busy timeout:
the kernel writes while the Jupyter server (another process) reads. The first writer to open the
file creates the tables (``tables.SCHEMA``) and brings a store an earlier version made up to date
(``tables.upgrades``), once per ``Database``. Threads may share a ``Database``: each gets its own
connection.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

from .. import config, datadir
from . import tables


def default_path() -> Path:
    """Where the run store lives: ``data_dir()/runs.sqlite``."""
    return config.data_dir() / "runs.sqlite"


class Database:
    """The SQLite file at ``path`` (default ``data_dir()/runs.sqlite``); a write waits up to
    ``busy_timeout`` seconds for another writer, then raises "database is locked"."""

    def __init__(self, path: str | os.PathLike | None = None, busy_timeout: float = 10.0):
        self._in_data_dir = path is None
        self.path = Path(path) if path is not None else default_path()
        self.busy_timeout = busy_timeout
        self._local = threading.local()
        self._ready = False  # the tables made and up to date, by this object's first writer

    def connect(self, create: bool) -> sqlite3.Connection | None:
        """This thread's connection; ``create``: for writing (the folder, the file and the
        tables made if missing), else for reading (None while there is no file)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        if self._in_data_dir and create:  # someone else's folder, one we cannot write: one line
            datadir.ensure(self.path.parent)
        elif self._in_data_dir:
            datadir.check(self.path.parent)
        if not create and not self.path.exists():
            return None
        if create:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            if not self.path.exists():  # owner-only from the first byte
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
        if create:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise sqlite3.OperationalError(f"cannot use WAL journal mode (got {mode})")
            conn.execute("PRAGMA synchronous = NORMAL")
            if not self._ready:
                conn.executescript(f"BEGIN IMMEDIATE;{tables.SCHEMA}COMMIT;")  # idempotent
                # one write: two writers opening an old file add a column once
                with transaction(conn):
                    for sql in tables.upgrades(conn):
                        conn.execute(sql)
                self._ready = True
        self._local.conn = conn
        return conn

    def write(self) -> transaction:
        """``with db.write() as conn:``: one short write transaction on this thread's
        connection (made for writing: see ``connect``)."""
        return transaction(self.connect(create=True))

    def read(self, sql: str, args: tuple = (), plain: bool = False) -> list:
        """The rows of a query (``plain``: as tuples, not ``sqlite3.Row``); none while there is
        no store, or while another process is still creating its tables."""
        conn = self.connect(create=False)
        if conn is None:
            return []
        try:
            cur = conn.cursor()
            if plain:
                cur.row_factory = None
            return cur.execute(sql, args).fetchall()
        except sqlite3.OperationalError as e:
            if "no such table" in str(e):  # a file another process is still creating
                return []
            raise

    def close(self) -> None:
        """Close this thread's connection (others close when their thread ends)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


class transaction:
    """``with transaction(conn):`` BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error): short writes."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def __enter__(self):
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            try:
                self.conn.execute("COMMIT")
            except sqlite3.Error:  # busy or full: leave no transaction open for the next write
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                raise
        elif self.conn.in_transaction:  # SQLite may have rolled back already (a full disk)
            self.conn.execute("ROLLBACK")
        return False
