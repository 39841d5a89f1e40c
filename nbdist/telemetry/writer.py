"""A run's writes to the run store, made from a background thread so training never waits.

The kernel's main thread calls the typed methods (``add_metrics``, ``put_health``,
``add_events``, ``update_run``, ``end_run``, ``delete_run``); each queues its work, and every
``interval`` the thread writes what is queued, in order, merging consecutive appends to one table
into one transaction. ``flush_soon()`` has it write at once, for news that must not wait (a rank
died: the sidebar shows it within a second). When the store cannot be written (a read-only
directory, a full disk), ``error`` says why and every later write is dropped: the caller shows
one warning and the run goes on.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .events import MetricRecord, RunEvent, WorkerHealth
from .store import RunStore


@dataclass
class _Append:
    """Rows for one table of one run; ``write(store, run_id, rows)`` stores them."""

    write: Callable[[RunStore, int, list], None]
    run_id: int
    rows: list


class StoreWriter:
    """Queues a run's writes; a daemon thread stores them every ``interval`` seconds."""

    def __init__(self, store: RunStore, interval: float = 0.5):
        self.store = store
        self.interval = interval
        self.error: str | None = None
        self._ops: deque[_Append | Callable[[RunStore], None]] = deque()
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

    def end_run(self, run_id: int, status: str, failures: list[dict] | None = None) -> None:
        """Queue the run's end: its status and failures."""
        self._call(lambda store: store.end_run(run_id, status, failures))

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
        while not self._stop:
            self._wake.wait(self.interval)
            self._wake.clear()  # before writing: a later flush_soon() wakes the next wait
            self._flush()
        self._flush()

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
        for op in merged:
            if self.error is not None:
                return
            try:
                if isinstance(op, _Append):
                    op.write(self.store, op.run_id, op.rows)
                else:
                    op(self.store)
            except (sqlite3.Error, OSError) as e:
                self.error = f"{type(e).__name__}: {e}"

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued and stop the thread."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
