"""The engine's sender: what ``report()`` and ``event()`` queued, sent to the notebook in batches.

A daemon thread (one per engine) makes each queued tuple a ``MetricRecord`` (reading a tensor
loss there, off the training thread) and sends them every half second, with a ``HealthSample``
(``health``), as one ``Batch`` through ipyparallel's data publication (the schema is
``nbdist.telemetry.events``). Health flows whether or not the cell reports. The thread sleeps
between cells, and its first batch goes out half a second into a cell: a short cell sends one
batch, from ``end_cell``. A cell nobody in the kernel watches (``telemetry=False``: ``Cluster.run``
with no observer) wakes no thread and sends nothing.

The batches must carry the cell's request as their parent, or the notebook cannot tie them to the
cell: ipykernel keeps the parent per execution context, which a thread does not inherit. So the
runner calls ``begin_cell()`` on the main thread when a cell starts (it captures the parent) and
``end_cell()`` when it ends (the last records and a final health sample go out before the reply).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque

from ...config import CellOptions
from ...telemetry import events
from ...telemetry.events import Batch, EventRecord, MetricRecord
from .. import state
from .health import Health

# Batches go out as often as the board is drawn (the cell's --refresh: twice a second unless it
# says otherwise), each with a health sample. Each batch costs the engine, the controller's hub
# and the kernel's client thread about a millisecond of CPU each (measured: at 5 batches/s/rank
# the kernel's client thread alone took 0.8 % of a core).
MAX_QUEUED = 200_000  # records kept if the sender cannot keep up (oldest dropped)


class Sender:
    """This engine's queue of records and events, and the thread that sends them."""

    def __init__(self) -> None:
        # report()'s tuples, in MetricRecord's field order: a plain tuple is the cheapest thing
        # to build on the training thread (a NamedTuple costs half as much again, measured)
        self.queue: deque[tuple] = deque(maxlen=MAX_QUEUED)
        self.events: deque[EventRecord] = deque(maxlen=10_000)
        self.lock = threading.Lock()  # one sender at a time: the thread or end_cell()
        self.wake = threading.Event()  # send now (a NaN loss), or the cell ended
        self.begun = threading.Event()  # a watched cell began: the sleeping thread starts
        self.thread: threading.Thread | None = None
        self.parent: dict | None = None  # the running cell's request header; None between cells
        self.pub = None  # (session, socket, topic)
        self.rank = -1
        self.pid = os.getpid()
        self.seq = 0
        self.health = Health()
        self.health_due = 0.0
        self.interval = CellOptions().refresh  # seconds between batches: the cell's --refresh

    # -- cell boundaries (main thread) ----------------------------------------------------------
    def begin_cell(self, telemetry: bool, opts: CellOptions) -> None:
        self.parent = None
        self.interval = opts.refresh
        self.queue.clear()
        self.events.clear()  # a checkpoint's event from an unwatched cell is not the next one's
        if not telemetry:
            return
        from IPython import get_ipython

        shell = get_ipython()
        # ipyparallel's engine kernel sets the shell's data publisher; a plain kernel has none.
        data_pub = getattr(shell, "__dict__", {}).get("_data_pub") if shell is not None else None
        if data_pub is None or data_pub.session is None:  # not an ipyparallel engine
            return
        from jupyter_client.session import extract_header

        parent = extract_header(getattr(shell, "parent_header", None) or {}) or dict(
            data_pub.parent_header
        )
        self.pub = (data_pub.session, data_pub.pub_socket, data_pub.topic)
        info = state.engine.rank_info
        self.rank = info.rank if info is not None else -1
        self.pid = os.getpid()  # this module may be imported before the engine was forked
        self.health.begin_cell()
        self.health_due = 0.0
        self.parent = parent or None
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self._loop, name="nbdist-reporter", daemon=True)
            self.thread.start()
        self.begun.set()

    def end_cell(self) -> None:
        if self.parent is None:
            return
        try:
            self.flush(health=True)
        except Exception:  # telemetry never fails a cell
            pass
        finally:
            self.parent = None

    # -- sending --------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            if self.parent is None:  # between cells nothing is sent: sleep until one begins
                self.begun.wait()
                self.begun.clear()
                continue
            self.wake.wait(self.interval)
            self.wake.clear()
            if self.parent is None:
                continue
            try:
                self.flush(health=time.monotonic() >= self.health_due)
            except Exception:  # never let telemetry kill the thread; the next batch retries
                time.sleep(self.interval)

    def flush(self, health: bool = False) -> None:
        """Send what is queued (and a health sample) as one batch, if a cell is running."""
        with self.lock:
            parent = self.parent
            if parent is None or self.pub is None:
                return
            q = self.queue
            raw = [q.popleft() for _ in range(len(q))]
            if raw:  # what report() leaves to this thread: its pace, counted here
                self.health.count(raw)
            records = [_record(rec) for rec in raw]
            evs = [self.events.popleft() for _ in range(len(self.events))]
            sample = None
            if health:  # quick: it reads no DDP timers while the rank is in a collective
                self.health_due = time.monotonic() + self.interval
                sample = self.health.sample()
            if not records and not evs and sample is None:
                return
            self.seq += 1
            batch = Batch(self.rank, self.seq, time.time(), records, sample, evs)
            _publish(self.pub, parent, {events.key(self.pid, self.seq): batch})

    def publish(self, data: dict) -> bool:
        with self.lock:
            if self.parent is None or self.pub is None:
                return False
            _publish(self.pub, self.parent, data)
            return True


#: This engine's sender (``calls`` queues into it).
engine = Sender()


def _publish(pub: tuple, parent: dict, data: dict) -> None:
    """ipyparallel's ``publish_data``, with an explicit parent (safe from any thread)."""
    from ipyparallel.serialize import serialize_object

    session, sock, topic = pub
    buffers = serialize_object(
        data, buffer_threshold=session.buffer_threshold, item_threshold=session.item_threshold
    )
    session.send(
        sock,
        "data_message",
        content={"keys": list(data)},
        parent=parent,
        buffers=buffers,
        ident=topic,
    )


def _record(raw: tuple) -> MetricRecord:
    """``report()``'s tuple as a record, its loss and metrics floats (a tensor is read here, off
    the training thread)."""
    rec = MetricRecord._make(raw)
    loss = rec.loss
    if loss is not None and not isinstance(loss, float):
        rec = rec._replace(loss=_read(loss))
    extra = rec.extra
    if extra and any(not isinstance(v, (float, int)) for v in extra.values()):
        rec = rec._replace(extra={k: _read(v) for k, v in extra.items()})
    return rec


def _read(value: object) -> float | None:
    """A value report() left as it was (a device tensor) read as a float; None if it cannot be."""
    try:
        return float(value)  # type: ignore[arg-type]
    except Exception:
        return None


# -- the runner's hooks, and others' data ---------------------------------------------------------
def begin_cell(telemetry: bool, opts: CellOptions) -> None:
    """Runner hook, main thread, cell start: capture the cell's request, start the sender at
    the pace ``opts`` asks (``telemetry`` False: nobody watches this cell, nothing is sent)."""
    engine.begin_cell(telemetry, opts)


def end_cell() -> None:
    """Runner hook, main thread, cell end: send everything left, then stop sending."""
    engine.end_cell()


def publish(data: dict) -> bool:
    """Send ``data`` (under keys of its own kind: the collector reads ``nbdist:`` keys only) to
    the notebook, tied to the running cell, from any thread; False between cells."""
    return engine.publish(data)
