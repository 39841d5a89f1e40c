"""Framework adapters: a framework's metrics on nbdist's dashboard and in its run store, one line.

- ``lightning.LightningLogger``: ``Trainer(logger=nbdist.LightningLogger())``
- ``accelerate.AccelerateTracker``: ``Accelerator(log_with=nbdist.AccelerateTracker())``
- ``transformers.HuggingFaceCallback``: ``Trainer(..., callbacks=[nbdist.HuggingFaceCallback()])``

Each module imports its framework, so nothing heavy is imported until an adapter is used. Off
nbdist engines (the same script under plain torchrun, a notebook's own kernel) every adapter is
a silent no-op, so a script keeps the line wherever it runs. What they share is here: the test
for an engine, and the filter that turns a framework's metrics into what ``report()`` accepts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from numbers import Integral, Real
from typing import Any

from ..state import engine

#: report()'s own arguments: a metric of one of these names is renamed ``logged_<name>``.
RESERVED = frozenset({"step", "loss", "samples", "total"})
_UNSAFE = re.compile(r"[^\w./-]")
_LOSS_NOISE = frozenset({"train", "training", "step"})


def on_engine() -> bool:
    """True on an nbdist engine (where ``report()`` reaches the notebook); False elsewhere."""
    return engine.rank_info is not None


def is_loss(name: str) -> bool:
    """A training loss by its name: ``loss``, ``train_loss``, ``train/loss``, ``loss_step``...
    (not ``val_loss``, nor an epoch mean such as ``train_loss_epoch``)."""
    words = [w for w in re.split(r"[/_.\s-]+", name.lower()) if w and w not in _LOSS_NOISE]
    return words == ["loss"]


def safe_name(name: Any) -> str:
    """``name`` as a metric name: text, odd characters as ``_``, never one of report()'s own."""
    text = _UNSAFE.sub("_", str(name))
    return f"logged_{text}" if text in RESERVED else text


def number(value: Any) -> float | None:
    """``value`` as a finite float (a number, or a one-element tensor or array), else None."""
    try:
        if isinstance(value, Real):
            f = float(value)
        elif _size(value) == 1:
            f = float(value.item())  # a device tensor waits for its stream, as other loggers do
        else:
            return None
    except (TypeError, ValueError, OverflowError, RuntimeError):
        return None
    return f if math.isfinite(f) else None


def numbers(values: Mapping, skip: str | None = None) -> dict[str, float]:
    """The finite numbers in ``values`` by safe name (``skip``: a key left out): what
    ``report(**metrics)`` accepts; text, lists and NaN are left out."""
    out = {}
    for key, value in values.items():
        if key != skip and (f := number(value)) is not None:
            out[safe_name(key)] = f
    return out


def whole(step: Any) -> int | None:
    """``step`` as report()'s step: a whole number (numpy's too), else None."""
    return int(step) if isinstance(step, Integral) and not isinstance(step, bool) else None


def loss_value(value: Any) -> Any:
    """``value`` as report()'s loss: a float (NaN kept, the dashboard flags it), a one-element
    tensor (left for report() to read off the training thread), or None."""
    if isinstance(value, Real):
        try:
            return float(value)
        except (TypeError, ValueError, OverflowError):
            return None
    if hasattr(value, "detach") and _size(value) == 1:
        return value
    return None


def _size(value: Any) -> int | None:
    numel = getattr(value, "numel", None)  # torch; numpy arrays have .size
    size = numel() if callable(numel) else getattr(value, "size", None)
    return size if isinstance(size, int) else None
