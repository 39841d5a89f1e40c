"""Hugging Face Accelerate on the dashboard: ``Accelerator(log_with=nbdist.AccelerateTracker())``.

A custom tracker, as Accelerate accepts them in ``log_with`` (alone or in a list beside
``"tensorboard"``...). As with any tracker, call ``accelerator.init_trackers(name)`` once and
``accelerator.log({"loss": loss, ...}, step=step)`` from the loop: the value named like a
training loss (``loss``, ``train_loss``, ``train/loss``; a one-element tensor is read off the
training thread) becomes the dashboard's loss, the other numbers its metrics.

Accelerate calls trackers on the main process only (``init_trackers`` and ``log`` are
``@on_main_process``), so only rank 0 reports through it: the health table shows the other
ranks' liveness and resources, not their step times (call ``nbdist.report(step=...)`` there for
those). Off nbdist engines the tracker records nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from accelerate.tracking import GeneralTracker

from ..reporting.calls import report
from . import is_loss, loss_value, number, numbers, on_engine, whole


class AccelerateTracker(GeneralTracker):
    """An Accelerate tracker that sends ``accelerator.log`` values to nbdist's dashboard and run
    store. ``total``: the number of steps, for the progress bar and ETA; ``samples``: the samples
    this rank processes between two ``log`` calls (for samples/s)."""

    name = "nbdist"
    requires_logging_directory = False

    def __init__(self, total: int | None = None, samples: float | None = None) -> None:
        super().__init__()
        self.enabled = on_engine()
        steps = whole(total)
        self.total = steps if steps is not None and steps >= 1 else None
        self.samples = number(samples)

    @property
    def tracker(self) -> AccelerateTracker:
        """Accelerate's handle on the underlying run: this tracker itself (it has no other)."""
        return self

    def store_init_configuration(self, values: dict) -> None:
        """Hyperparameters are not recorded (the run store keeps the cell's options)."""

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Report ``values`` at ``step``: the training loss as the loss, numbers as metrics;
        text and non-finite metrics are left out."""
        if not self.enabled:
            return
        key = next((k for k in values if is_loss(str(k))), None)
        loss = loss_value(values[key]) if key is not None else None
        report(
            step=whole(step),
            loss=loss,
            samples=self.samples,
            total=self.total,
            **numbers(values, skip=key),
        )
