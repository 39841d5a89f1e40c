"""``nbdist.report()`` and ``event()``: what a cell's code tells the notebook while it runs.

``report()`` only appends a tuple to the sender's queue (``sender``), so it costs about a
microsecond and never blocks the training step: the common call's arguments are checked by a few
set lookups of types, and anything else gets the slow check and its one-line error. A tensor loss
is read later, on the sender's thread (a CUDA loss does not synchronise the step). In a cell
nobody watches (``telemetry=False``), ``report()`` and ``event()`` do nothing.
"""

from __future__ import annotations

import time
from numbers import Real
from typing import Any

from ...errors import UsageError
from ...telemetry.events import EventRecord
from .. import context
from .sender import engine as _sender


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
    if _sender.parent is None:  # a cell nobody watches, or none (a thread left running)
        context.current()  # off an engine: the one-line "runs on nbdist engines only" error
        return
    _append((_now(), step, loss, samples, total, metrics or None))  # MetricRecord's order
    if type(loss) is float and loss - loss != 0.0:  # NaN or +-inf: out at once
        _sender.wake.set()
    if _step_hook is not None:  # a cell under --profile counts its steps here
        _step_hook()


_now = time.time
_step_hook: Any = None  # called at every report() while a profiled cell counts steps
_append = _sender.queue.append  # the deque lives as long as the engine (cleared, not replaced)
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
    if _sender.parent is None:
        return
    _sender.events.append(EventRecord(time.time(), str(kind), str(message), data or None))
    _sender.wake.set()


def on_step(hook: Any) -> None:
    """Call ``hook()`` at every ``report()`` from now (None: no more): a step, for the
    profiler (``debug.profile``)."""
    global _step_hook
    _step_hook = hook
