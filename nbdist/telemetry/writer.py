"""A run's writes to the run store, made from a background thread so training never waits.

The kernel's main thread calls the typed methods (``add_metrics``, ``put_health``, ``add_events``,
``update_run``, ``put_summary``, ``end_run``, ``delete_run``); each queues its work, and every
``interval`` the thread writes what is queued, in order, merging consecutive appends to one table
into one transaction. ``flush_soon()`` has it write at once, for news that must not wait (a rank
died: the sidebar shows it within a second). When another process holds the store ("database is
locked", past the store's busy timeout), what is queued stays queued, in order, and is written again
after a pause that doubles up to ``MAX_PAUSE`` seconds: nothing is lost, unless the store stays
locked for ``give_up_after`` seconds. When the store cannot be written (a read-only directory, a
full disk, or locked that long), ``error`` says why and every later write is dropped: the caller
shows one warning and the run goes on. Anything else that goes wrong on the thread ends it the same
way, with ``error`` set: it never dies silently.

What waits is bounded: at most ``max_queued`` rows (metric records, health samples, events). Past
that (a store locked for long, a disk slower than the run), new rows are dropped, counted
(``dropped``) and said once in a warning, rather than making the caller wait: the caller is the
kernel's poll loop, which also watches the ranks for failures and draws the board, and waiting
there would only move the queue into the engines' unread batches. A record the store cannot keep
(``rows.BadValue``: a step past 2**63, a time that is not a number) is left out alone, counted
(``refused``) and said once; the records written with it are kept. ``close()`` says the totals
if more were lost after the first warning.
"""

from __future__ import annotations

import sqlite3
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from .events import MetricRecord, RunEvent, WorkerHealth
from .rows import Refused
from .store import RunStore

#: Longest pause between two tries at writing to a locked store, in seconds.
MAX_PAUSE = 2.0
#: The most rows that wait to be written: over eight minutes of a run that reports a thousand
#: times a second, locked out of its store; some 100-200 MB at most.
MAX_QUEUED = 500_000


@dataclass
class _Append:
    """Rows for one table of one run; ``write(store, run_id, rows, refused=)`` stores them;
    ``n``: how many records they hold."""

    write: Callable[..., None]
    run_id: int
    rows: list
    n: int


def _stderr(text: str) -> None:
    print(f"nbdist: warning: {text}", file=sys.stderr, flush=True)


class StoreWriter:
    """Queues a run's writes; a daemon thread stores them every ``interval`` seconds.
    ``warn(line)`` says what is lost (default: a line on stderr, in the running cell)."""

    def __init__(
        self,
        store: RunStore,
        interval: float = 0.5,
        give_up_after: float = 300.0,
        max_queued: int = MAX_QUEUED,
        warn: Callable[[str], None] = _stderr,
    ):
        self.store = store
        self.interval = interval
        self.give_up_after = give_up_after
        self.max_queued = max_queued
        self.warn = warn
        self.error: str | None = None
        self.retries = 0  # writes put off because the store was locked
        self.dropped = 0  # rows not queued: the queue was full
        self.refused = Refused()  # records the store cannot keep
        self._said = {"dropped": 0, "refused": 0}  # the counts at the last warning
        self._queued = 0  # rows in _ops
        self._lock = threading.Lock()  # _ops and _queued, between the caller and the thread
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
        self._append(RunStore.add_metric_records, run_id, [(rank, records)], len(records))

    def put_health(self, run_id: int, rows: Iterable[WorkerHealth]) -> None:
        """Queue each rank's latest health."""
        rows = list(rows)
        self._append(RunStore.put_health, run_id, rows, len(rows))

    def add_events(self, run_id: int, events: Iterable[RunEvent]) -> None:
        """Queue events of the run."""
        events = list(events)
        self._append(RunStore.add_events, run_id, events, len(events))

    def update_run(self, run_id: int, **fields: Any) -> None:
        """Queue ``RunStore.update_run(run_id, **fields)``."""
        self._call(lambda store: store.update_run(run_id, **fields))

    def put_summary(self, run_id: int, summary: dict[str, tuple[float, float, float]]) -> None:
        """Queue ``RunStore.put_summary``: each metric's (last, least, greatest) mean."""
        summary = dict(summary)
        self._call(lambda store: store.put_summary(run_id, summary))

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

    def _append(self, write: Callable[..., None], run_id: int, rows: list, n: int) -> None:
        if not self._accepting() or not n:
            return
        with self._lock:
            if self._queued + n <= self.max_queued:
                self._queued += n
                self._ops.append(_Append(write, run_id, rows, n))
                return
            self.dropped += n
        self._say("dropped")

    def _call(self, op: Callable[[RunStore], None]) -> None:
        if self._accepting():
            with self._lock:
                self._ops.append(op)

    def _accepting(self) -> bool:
        return self.error is None and self._thread is not None and self._thread.is_alive()

    def _say(self, what: str, totals: bool = False) -> None:
        """Warn that rows were lost (``dropped`` or ``refused``): at the first loss, and with
        the ``totals`` at close if more were lost since."""
        count = self.dropped if what == "dropped" else self.refused.count
        first = not self._said[what]
        if count == self._said[what] or not (first or totals):
            return
        self._said[what] = count
        where = f"the run store {self.store.path}"
        if what == "refused" and first:
            line = (
                f"refused {count:,} record(s) it cannot keep ({self.refused.first}); "
                "the others are recorded"
            )
        elif what == "refused":
            line = f"refused {count:,} record(s) of this run in all ({self.refused.first})"
        elif first:
            line = (
                f"is behind ({self.max_queued:,} rows wait to be written): new rows are dropped "
                f"until it catches up, {count:,} so far (the notebook's board has them all)"
            )
        else:
            line = f"dropped {count:,} row(s) of this run that it had no room to queue"
        self.warn(f"{where} {line}")

    # -- the thread --------------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while True:
                self._wake.wait(self._pause)
                self._wake.clear()  # before writing: a later flush_soon() wakes the next wait
                self._flush()
                if self.error is not None or (
                    self._stop and (not self._ops or time.monotonic() > self._close_by)
                ):
                    return
        except Exception as e:  # nbdist's own fault: said through ``error``, never silent
            self.error = f"the store writer stopped ({type(e).__name__}: {e})"
        finally:
            if self.error is not None:
                with self._lock:  # nothing more will be written: let it go
                    self._ops.clear()
                    self._queued = 0

    def _take(self) -> list[_Append | Callable[[RunStore], None]]:
        """What is queued, taken off the queue, consecutive appends to one table merged."""
        with self._lock:
            ops = list(self._ops)
            self._ops.clear()
        merged: list[_Append | Callable[[RunStore], None]] = []
        for op in ops:
            last = merged[-1] if merged else None
            if (
                isinstance(op, _Append)
                and isinstance(last, _Append)
                and (last.write, last.run_id) == (op.write, op.run_id)
            ):
                last.rows.extend(op.rows)  # one executemany per run of appends
                last.n += op.n
            elif isinstance(op, _Append):
                merged.append(_Append(op.write, op.run_id, list(op.rows), op.n))
            else:
                merged.append(op)
        return merged

    def _done(self, op: _Append | Callable[[RunStore], None]) -> None:
        if isinstance(op, _Append):
            with self._lock:
                self._queued -= op.n

    def _flush(self) -> None:
        merged = self._take()
        for i, op in enumerate(merged):
            if self.error is not None:
                return
            refused = Refused()
            try:
                if isinstance(op, _Append):
                    op.write(self.store, op.run_id, op.rows, refused=refused)
                else:
                    op(self.store)
            except sqlite3.OperationalError as e:
                if not _locked(e):
                    self.error = f"{type(e).__name__}: {e}"
                    return
                self._put_back(merged[i:], e)  # its transaction was rolled back: none written
                return
            except (UsageError, OSError, sqlite3.Error, ValueError, TypeError, OverflowError) as e:
                if _store_fault(e):
                    self.error = f"{type(e).__name__}: {e}"
                    return
                # a record the row checks missed; its transaction was rolled back: the op is
                # lost, and said, and the writer goes on
                refused = Refused()
                refused.add(f"{type(e).__name__}: {e}", getattr(op, "n", 1))
            self._done(op)
            if refused.count:
                self.refused.merge(refused)
                self._say("refused")
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
        with self._lock:
            self._ops.extendleft(reversed(ops))
        self._pause = min(MAX_PAUSE, max(self.interval, 2 * self._pause))

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued (trying for up to ``timeout`` s) and stop the thread."""
        self._close_by = time.monotonic() + timeout
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._say("dropped", totals=True)  # when more were lost after the first warning
        self._say("refused", totals=True)


def _store_fault(e: Exception) -> bool:
    """True for what is wrong with the store (its folder, its disk, a damaged file); False for
    what is wrong with a record (a value SQLite cannot bind or a column refuses)."""
    if isinstance(e, (UsageError, OSError)):
        return True
    record = (sqlite3.IntegrityError, sqlite3.DataError, sqlite3.ProgrammingError)
    return isinstance(e, sqlite3.Error) and not isinstance(e, (*record, sqlite3.InterfaceError))


def _locked(e: sqlite3.OperationalError) -> bool:
    """True for "database is locked" (or busy): another connection holds the store for now."""
    text = str(e).lower()
    return "locked" in text or "busy" in text
