"""The transformers ``Trainer`` on the dashboard: ``callbacks=[nbdist.HuggingFaceCallback()]``.

Two hooks, on every rank. ``on_step_end`` (every optimizer step) reports the step and the samples
it took on this rank (per-device batch size x gradient accumulation), so throughput and per-rank
step times are live. ``on_log`` (every ``logging_steps``, and at evaluations and the end)
reports what the Trainer logged: ``loss`` (already averaged over ranks and over the steps since
the last log) as the loss, ``learning_rate`` as ``lr``, and ``grad_norm``, ``epoch``,
``eval_*``... as metrics. Steps are the Trainer's ``state.global_step`` (the first step is 1);
``total`` is ``state.max_steps``. Off nbdist engines the callback records nothing.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from ..reporting.calls import report
from . import loss_value, numbers, on_engine

_RENAMED = {"learning_rate": "lr"}


class HuggingFaceCallback(TrainerCallback):
    """A Trainer callback that sends steps and logged metrics to the dashboard and run store."""

    def __init__(self) -> None:
        self.enabled = on_engine()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Every optimizer step: the step and this rank's samples."""
        if self.enabled:
            samples = args.per_device_train_batch_size * args.gradient_accumulation_steps
            report(step=state.global_step, samples=samples, total=_total(state))

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """What the Trainer logged: the loss as the loss, the other numbers as metrics."""
        if not self.enabled or not logs:
            return
        metrics = numbers({_RENAMED.get(k, k): v for k, v in logs.items()}, skip="loss")
        loss = loss_value(logs.get("loss"))
        report(step=state.global_step, loss=loss, total=_total(state), **metrics)


def _total(state: TrainerState) -> int | None:
    total = state.max_steps
    return total if isinstance(total, int) and total >= 1 else None
