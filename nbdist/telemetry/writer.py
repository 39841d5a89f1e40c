"""A run's writes to the run store, made from a background thread so training never waits.

The kernel's main thread calls the typed methods (``add_metrics``, ``put_health``,
``add_events``, ``update_run``, ``end_run``, ``delete_run``); each queues its work, and every
``interval`` the thread writes what is queued, in order, merging consecutive appends to one table
into one transaction. ``flush_soon()`` has it write at once, for news that must not wait (a rank
died: the sidebar shows it within a second). When another process holds the store ("database is
locked", past the store's busy timeout), what is queued stays queued, in order, and is written
again after a pause that doubles up to ``MAX_PAUSE`` seconds: nothing is lost, unless the store
stays locked for ``give_up_after`` seconds. When the store cannot be written (a read-only
directory, a full disk, or locked that long), ``error`` says why and every later write is
dropped: the caller shows one warning and the run goes on.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from .events import MetricRecord, RunEvent, WorkerHealth
from .store import RunStore

#: Longest pause between two tries at writing to a locked store, in seconds.
MAX_PAUSE = 2.0


@dataclass
class _Append:
    """Rows for one table of one run; ``write(store, run_id, rows)`` stores them."""

    write: Callable[[RunStore, int, list], None]
    run_id: int
    rows: list


class StoreWriter:
    """Queues a run's writes; a daemon thread stores them every ``interval`` seconds."""

    def __init__(self, store: RunStore, interval: float = 0.5, give_up_after: float = 300.0):
        self.store = store
        self.interval = interval
        self.give_up_after = give_up_after
        self.error: str | None = None
        self.retries = 0  # writes put off because the store was locked
        self._ops: deque[_Append | Callable[[RunStore], None]] = deque()
        self._wake = threading.Event()
        self._stop = False
        self._close_by = 0.0
        self._pause = interval
        self._locked_since: float | None = None
        self._thread: threading.Thread | None = None

    def start_run(self, **fields: Any) -> int | None:
        """Record the run now (its id is needed at once); None when the store is unwritable."""
        try:
            run_id = self.store.start_run(**fields)
        except (sqlite3.Error, OSError, UsageError) as e:  # UsageError: the data folder
            self.error = f"{type(e).__name__}: {e}"
            return None
        self._thread = threading.Thread(target=self._loop, name="nbdist-store", daemon=True)
        self._thread.start()
        return run_id

    # -- what the kernel queues ------------------------------------------------------------------
    def add_metrics(self, run_id: int, rank: int, records: Sequence[MetricRecord]) -> None:
        """Queue one rank's metric records."""
        self._append(RunStore.add_metric_records, run_id, [(rank, records)])

    def put_health(self, run_id: int, rows: Iterable[WorkerHealth]) -> None:
        """Queue each rank's latest health."""
        self._append(RunStore.put_health, run_id, list(rows))

    def add_events(self, run_id: int, events: Iterable[RunEvent]) -> None:
        """Queue events of the run."""
        self._append(RunStore.add_events, run_id, list(events))

    def update_run(self, run_id: int, **fields: Any) -> None:
        """Queue ``RunStore.update_run(run_id, **fields)``."""
        self._call(lambda store: store.update_run(run_id, **fields))

    def end_run(
        self,
        run_id: int,
        status: str,
        failures: list[dict] | None = None,
        ended: float | None = None,
    ) -> None:
        """Queue the run's end: its status, failures and time (default: when written)."""
        self._call(lambda store: store.end_run(run_id, status, failures, ended))

    def delete_run(self, run_id: int) -> None:
        """Queue forgetting the run (one that never reached the engines)."""
        self._call(lambda store: store.delete_run(run_id))

    def flush_soon(self) -> None:
        """Wake the thread to write what is queued now, without waiting for ``interval``."""
        self._wake.set()

    def _append(
        self, write: Callable[[RunStore, int, list], None], run_id: int, rows: list
    ) -> None:
        if self._accepting():
            self._ops.append(_Append(write, run_id, rows))

    def _call(self, op: Callable[[RunStore], None]) -> None:
        if self._accepting():
            self._ops.append(op)

    def _accepting(self) -> bool:
        return self.error is None and self._thread is not None

    # -- the thread --------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            self._wake.wait(self._pause)
            self._wake.clear()  # before writing: a later flush_soon() wakes the next wait
            self._flush()
            if self._stop and (
                not self._ops or self.error is not None or time.monotonic() > self._close_by
            ):
                return

    def _flush(self) -> None:
        merged: list[_Append | Callable[[RunStore], None]] = []
        for _ in range(len(self._ops)):
            op = self._ops.popleft()
            last = merged[-1] if merged else None
            if (
                isinstance(op, _Append)
                and isinstance(last, _Append)
                and (last.write, last.run_id) == (op.write, op.run_id)
            ):
                last.rows.extend(op.rows)  # one executemany per run of appends
            else:
                merged.append(
                    _Append(op.write, op.run_id, list(op.rows)) if isinstance(op, _Append) else op
                )
        for i, op in enumerate(merged):
            if self.error is not None:
                return
            try:
                if isinstance(op, _Append):
                    op.write(self.store, op.run_id, op.rows)
                else:
                    op(self.store)
            except sqlite3.OperationalError as e:
                if not _locked(e):
                    self.error = f"{type(e).__name__}: {e}"
                    return
                self._put_back(merged[i:], e)  # its transaction was rolled back: none written
                return
            except (sqlite3.Error, OSError, UsageError) as e:
                self.error = f"{type(e).__name__}: {e}"
                return
        self._pause, self._locked_since = self.interval, None

    def _put_back(self, ops: list, e: sqlite3.OperationalError) -> None:
        """Queue ``ops`` again, ahead of what came since, and pause longer before the next try
        (or give up, when the store has been locked for ``give_up_after`` seconds)."""
        now = time.monotonic()
        self._locked_since = self._locked_since or now
        if now - self._locked_since > self.give_up_after:
            self.error = f"{type(e).__name__}: {e} (for {self.give_up_after:g} s)"
            return
        self.retries += 1
        self._ops.extendleft(reversed(ops))
        self._pause = min(MAX_PAUSE, max(self.interval, 2 * self._pause))

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued (trying for up to ``timeout`` s) and stop the thread."""
        self._close_by = time.monotonic() + timeout
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)


def _locked(e: sqlite3.OperationalError) -> bool:
    """True for "database is locked" (or busy): another connection holds the store for now."""
    text = str(e).lower()
    return "locked" in text or "busy" in text
