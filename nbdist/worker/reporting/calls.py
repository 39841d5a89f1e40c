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
    progress bar and ETA; ``metrics``: any other numbers (``lr=...``, ``comm_time=SECONDS``),
    taken as the loss is: numbers, numpy scalars and one-element tensors on any device
    (``acc=(pred == y).float().mean()``). Never blocks: records are queued and sent in batches by
    a background thread.
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
        metrics = _check(step, samples, total, metrics)
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


def _check(step: Any, samples: Any, total: Any, metrics: dict) -> dict:
    """report()'s arguments off the fast path: the one-line error for what is wrong; the
    metrics, each a number (a GPU tensor is left for the sender to read, as the loss is)."""
    if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
        raise UsageError(f"nbdist.report: step must be a whole number, not {step!r}")
    if step is not None and not -_STEP_MAX <= step <= _STEP_MAX:
        raise UsageError(f"nbdist.report: step {step} is too large to record: keep it below 2**63")
    if samples is not None and (not isinstance(samples, Real) or isinstance(samples, bool)):
        raise UsageError(f"nbdist.report: samples must be a number, not {samples!r}")
    if total is not None and (not isinstance(total, int) or isinstance(total, bool) or total < 1):
        raise UsageError(f"nbdist.report: total must be a whole number >= 1, not {total!r}")
    if all(type(v) in _NUMBERS for v in metrics.values()):
        return metrics
    return {k: _value(f"metric {k}", v) for k, v in metrics.items()}


_NUMBERS = frozenset({int, float, bool})


def _loss_value(loss: Any) -> Any:
    return _value("loss", loss)


def _value(what: str, value: Any) -> Any:
    """A number, numpy scalar or one-element tensor as a float; a tensor off the CPU as itself
    (the sender reads it, so the step is not made to wait for the device)."""
    if isinstance(value, Real):
        return float(value)
    if hasattr(value, "detach"):  # a torch tensor
        t = value.detach()
        if t.numel() != 1:
            raise UsageError(
                f"nbdist.report: {what} must have one element, not shape {tuple(t.shape)}: "
                "reduce it first (.mean(), .sum())"
            )
        if t.is_complex():
            raise UsageError(f"nbdist.report: {what} must be a real number, not {value!r}")
        return float(t.item()) if t.device.type == "cpu" else t
    if getattr(value, "size", None) == 1 and hasattr(value, "item"):  # a numpy scalar or array
        item = value.item()
        if isinstance(item, Real):
            return float(item)
    raise UsageError(
        f"nbdist.report: {what} must be a number or a one-element tensor, not {value!r}"
    )


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
