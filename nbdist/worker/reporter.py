"""``nbdist.report()`` and the health sampler: what an engine tells the notebook while a cell runs.

``report()`` only appends a tuple to a queue, so it costs about a microsecond and never blocks
the training step. A daemon thread (one per engine) makes each a ``MetricRecord`` (reading a
tensor loss there, off the training thread) and sends them every half second, with a
``HealthSample``, as one ``Batch`` through ipyparallel's data publication (the schema is
``nbdist.telemetry.events``). Health flows whether or not the cell reports. The thread sleeps
between cells, and its first batch goes out half a second into a cell: a short cell sends one
batch, from ``end_cell``. A cell nobody in the kernel watches (``telemetry=False``: ``Cluster.run``
with no observer) wakes no thread and sends nothing; ``report()`` is then a no-op.

The batches must carry the cell's request as their parent, or the notebook cannot tie them to the
cell: ipykernel keeps the parent per execution context, which a thread does not inherit. So the
runner calls ``begin_cell()`` on the main thread when a cell starts (it captures the parent) and
``end_cell()`` when it ends (the last records and a final health sample go out before the reply).

Communication share: for DistributedDataParallel models held in the cell's namespace, from DDP's
own timers (backward communication not overlapped with compute, over the step); otherwise from
``report(..., comm_time=SECONDS)`` when the cell measures it itself.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import weakref
from collections import deque
from numbers import Real
from typing import Any

from ..errors import UsageError
from ..telemetry import events
from ..telemetry.events import Batch, EventRecord, HealthSample, MetricRecord
from . import context, state

# Seconds between batches while a cell runs. Each batch costs the engine, the controller's hub
# and the kernel's client thread about a millisecond of CPU each (measured: at 5 batches/s/rank
# the kernel's client thread alone took 0.8 % of a core), so they go out as often as the
# dashboard is drawn (twice a second), each with a health sample.
FLUSH_INTERVAL = 0.5
HEALTH_INTERVAL = 0.5  # seconds between health samples
_MAX_QUEUED = 200_000  # records kept if the sender cannot keep up (oldest dropped)


class _Reporter:
    """This engine's queue of records, its sender thread and its health sampler."""

    def __init__(self) -> None:
        # report()'s tuples, in MetricRecord's field order: a plain tuple is the cheapest thing
        # to build on the training thread (a NamedTuple costs half as much again, measured)
        self.queue: deque[tuple] = deque(maxlen=_MAX_QUEUED)
        self.events: deque[EventRecord] = deque(maxlen=10_000)
        self.lock = threading.Lock()  # one sender at a time: the thread or end_cell()
        self.wake = threading.Event()  # send now (a NaN loss), or the cell ended
        self.begun = threading.Event()  # a watched cell began: the sleeping thread starts
        self.thread: threading.Thread | None = None
        self.parent: dict | None = None  # the running cell's request header; None between cells
        self.pub = None  # (session, socket, topic)
        self.rank = -1
        self.seq = 0
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.proc = None
        self._reset()

    def _reset(self) -> None:
        self.last_report: float | None = None
        self.step_time: float | None = None
        self.last_step = None
        self.reports = 0
        self.comm_time: float | None = None
        self.health_due = 0.0
        # DDP's timed iteration of each model when the cell began: its comm share is shown
        # once the model has stepped in this cell (a new run's table starts empty)
        self.ddp_at_start: dict[int, int] = {}

    # -- cell boundaries (main thread) ----------------------------------------------------------
    def begin_cell(self, telemetry: bool = True) -> None:
        self.parent = None
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
        if self.pid != os.getpid():  # this module may be imported before the engine was forked
            self.pid, self.proc = os.getpid(), None
        self._reset()
        self.ddp_at_start = _ddp_iterations()
        state.engine.pipeline_idle = None  # a pipeline is shown once it steps in this cell
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
            self.wake.wait(FLUSH_INTERVAL)
            self.wake.clear()
            if self.parent is None:
                continue
            try:
                self.flush(health=time.monotonic() >= self.health_due)
            except Exception:  # never let telemetry kill the thread; the next batch retries
                time.sleep(FLUSH_INTERVAL)

    def flush(self, health: bool = False) -> None:
        """Send what is queued (and a health sample) as one batch, if a cell is running."""
        with self.lock:
            parent = self.parent
            if parent is None or self.pub is None:
                return
            q = self.queue
            raw = [q.popleft() for _ in range(len(q))]
            if raw:  # what report() leaves to this thread: its pace, counted here
                times = [self.last_report, *(t[0] for t in raw)]
                if times[-2] is not None:
                    self.step_time = times[-1] - times[-2]
                self.last_report = times[-1]
                self.reports += len(raw)
                for rec in raw:
                    if rec[5] and "comm_time" in rec[5]:
                        self.comm_time = float(rec[5]["comm_time"])
            records = [_record(rec) for rec in raw]
            evs = [self.events.popleft() for _ in range(len(self.events))]
            sample = None
            if health:
                self.health_due = time.monotonic() + HEALTH_INTERVAL
                sample = self._sample()
            if not records and not evs and sample is None:
                return
            self.seq += 1
            batch = Batch(self.rank, self.seq, time.time(), records, sample, evs)
            _publish(self.pub, parent, {events.key(self.pid, self.seq): batch})

    def _sample(self) -> HealthSample:
        import psutil

        if self.proc is None:
            self.proc = psutil.Process()
            self.proc.cpu_percent(None)
        gpu_util = gpu_mem = None
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            info = state.engine.rank_info
            dev = info.device if info is not None else "cuda:0"
            try:
                gpu_mem = torch.cuda.memory_allocated(dev)
                gpu_util = torch.cuda.utilization(dev)  # needs NVML (pynvml)
            except Exception:
                pass
        with self.proc.oneshot():
            cpu, rss = self.proc.cpu_percent(None), self.proc.memory_info().rss
        return HealthSample(
            time=time.time(),
            host=self.host,
            pid=self.pid,
            cpu=cpu,
            rss=rss,
            gpu_util=gpu_util,
            gpu_mem=gpu_mem,
            last_step=self.last_report,
            step_time=self.step_time,
            comm_share=self._comm_share(),
            reports=self.reports,
            pipeline=state.engine.pipeline if state.engine.pipeline_idle is not None else None,
            idle_share=state.engine.pipeline_idle,
            mesh=state.engine.mesh,
        )

    def _comm_share(self) -> float | None:
        if self.comm_time is not None and self.step_time:
            return max(0.0, min(1.0, self.comm_time / self.step_time))
        return _ddp_comm_share(self.ddp_at_start)


_reporter = _Reporter()


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
    """``report()``'s tuple as a record, its loss a float (a tensor is read here, off the
    training thread)."""
    rec = MetricRecord._make(raw)
    loss = rec.loss
    if loss is not None and not isinstance(loss, float):
        try:
            loss = float(loss)
        except Exception:
            loss = None
        rec = rec._replace(loss=loss)
    return rec


_ddp_models: weakref.WeakSet = weakref.WeakSet()


def _ddp_logs() -> list[tuple[int, dict]]:
    """(id, DDP's logging data) of each DDP model the cells' namespace holds or held."""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    ddp = torch.nn.parallel.DistributedDataParallel
    for v in list(state.namespace().values()):
        if isinstance(v, ddp):
            _ddp_models.add(v)
    out = []
    for m in list(_ddp_models):
        try:
            out.append((id(m), m._get_ddp_logging_data()))  # torch's timers: no public API
        except Exception:
            continue
    return out


def _ddp_iterations() -> dict[int, int]:
    """The latest timed iteration of each DDP model, by id."""
    return {key: int(d.get("iteration", -1)) for key, d in _ddp_logs()}


def _ddp_comm_share(at_start: dict[int, int]) -> float | None:
    """Share of DDP's step spent in backward communication that did not overlap compute, for
    a model that has stepped since the cell began (``at_start``: its iteration then)."""
    for key, d in _ddp_logs():
        if int(d.get("iteration", -1)) <= at_start.get(key, -1):
            continue  # its timers are from an earlier cell
        comm = d.get("avg_backward_comm_time", 0)
        comm -= d.get("avg_backward_compute_comm_overlap_time", 0)
        compute = d.get("avg_forward_compute_time", 0) + d.get("avg_backward_compute_time", 0)
        if compute > 0:
            return max(0.0, comm) / (max(0.0, comm) + compute)
    return None


# -- public ------------------------------------------------------------------------------------
def report(
    step: int | None = None,
    loss: Any = None,
    samples: float | None = None,
    total: int | None = None,
    **metrics: float,
) -> None:
    """Tell the notebook how training goes: one call per step (or every few steps).

    ``step``: the step number; ``loss``: a number or a one-element tensor (read off the training
    thread, so a CUDA loss does not synchronise the step); ``samples``: samples this rank
    processed since its last report (for samples/s); ``total``: the number of steps, for the
    progress bar and ETA; ``metrics``: any other numbers (``lr=...``, ``comm_time=SECONDS``).
    Never blocks: records are queued and sent in batches by a background thread.
    """
    # The common call (an int step, a float or tensor loss, numbers for samples and total)
    # takes the fast path: set lookups of types, a clock read and a deque append.
    if (
        type(step) not in _INT_OR_NONE
        or type(samples) not in _NUMBER_OR_NONE
        or type(total) not in _INT_OR_NONE
        or (total is not None and total < 1)
        or (step is not None and not -_STEP_MAX <= step <= _STEP_MAX)
        or metrics
    ):
        _check(step, samples, total, metrics)
    if type(loss) is not float and loss is not None:
        loss = _loss_value(loss)
    if _reporter.parent is None:  # a cell nobody watches, or none (a thread left running)
        context.current()  # off an engine: the one-line "runs on nbdist engines only" error
        return
    _append((_now(), step, loss, samples, total, metrics or None))  # MetricRecord's order
    if type(loss) is float and loss - loss != 0.0:  # NaN or +-inf: out at once
        _reporter.wake.set()
    if _step_hook is not None:  # a cell under --profile counts its steps here
        _step_hook()


_now = time.time
_step_hook: Any = None  # called at every report() while a profiled cell counts steps
_append = _reporter.queue.append  # the deque lives as long as the engine (cleared, not replaced)
_INT_OR_NONE = frozenset({int, type(None)})
_STEP_MAX = 2**63 - 1  # what the run store (SQLite's INTEGER) holds
_NUMBER_OR_NONE = frozenset({int, float, type(None)})


def _check(step: Any, samples: Any, total: Any, metrics: dict) -> None:
    """report()'s arguments off the fast path: the one-line error for what is wrong."""
    if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
        raise UsageError(f"nbdist.report: step must be a whole number, not {step!r}")
    if step is not None and not -_STEP_MAX <= step <= _STEP_MAX:
        raise UsageError(f"nbdist.report: step {step} is too large to record: keep it below 2**63")
    if samples is not None and (not isinstance(samples, Real) or isinstance(samples, bool)):
        raise UsageError(f"nbdist.report: samples must be a number, not {samples!r}")
    if total is not None and (not isinstance(total, int) or isinstance(total, bool) or total < 1):
        raise UsageError(f"nbdist.report: total must be a whole number >= 1, not {total!r}")
    for k, v in metrics.items():
        if not isinstance(v, Real):
            raise UsageError(f"nbdist.report: metric {k} must be a number, not {v!r}")


def _loss_value(loss: Any) -> Any:
    if isinstance(loss, Real):
        return float(loss)
    detach = getattr(loss, "detach", None)
    if detach is None:
        raise UsageError(f"nbdist.report: loss must be a number or a tensor, not {loss!r}")
    t = detach()
    if t.numel() != 1:
        raise UsageError(f"nbdist.report: loss must have one element, not shape {tuple(t.shape)}")
    return t.item() if t.device.type == "cpu" else t  # a GPU value is read by the sender


def event(kind: str, message: str = "", **data: Any) -> None:
    """Record an engine-side event (a checkpoint written, ...): shown on the dashboard, stored."""
    r = _reporter
    if r.parent is None:
        return
    r.events.append(EventRecord(time.time(), str(kind), str(message), data or None))
    r.wake.set()


def on_step(hook: Any) -> None:
    """Call ``hook()`` at every ``report()`` from now (None: no more): a step, for the
    profiler (``debug.profile``)."""
    global _step_hook
    _step_hook = hook


def publish(data: dict) -> bool:
    """Send ``data`` (under keys of its own kind: the collector reads ``nbdist:`` keys only) to
    the notebook, tied to the running cell, from any thread; False between cells."""
    r = _reporter
    with r.lock:
        if r.parent is None or r.pub is None:
            return False
        _publish(r.pub, r.parent, data)
        return True


def begin_cell(telemetry: bool = True) -> None:
    """Runner hook, main thread, cell start: capture the cell's request, start the sender
    (``telemetry`` False: nobody watches this cell, nothing is sent)."""
    _reporter.begin_cell(telemetry)


def end_cell() -> None:
    """Runner hook, main thread, cell end: send everything left, then stop sending."""
    _reporter.end_cell()
