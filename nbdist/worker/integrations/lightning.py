"""PyTorch Lightning on the dashboard: ``Trainer(logger=nbdist.LightningLogger())``.

Lightning hands loggers what ``self.log`` recorded only every ``log_every_n_steps`` (50 by
default) and on epoch ends: those metrics go to ``report()`` (the training loss, by its name, as
the loss; ``val_loss``, ``lr``, ``epoch``... as metrics). For a live dashboard the logger also
registers a companion callback that reports every training batch: the step, the loss the
training step returned and the batch's size, with ``total`` = the trainer's estimated stepping
batches for the ETA. It runs on every rank (per-rank step times feed the health table) and never
synchronises the device: the loss tensor is read by report()'s sender thread.

Steps count as Lightning's loggers count them: from 0, in optimizer steps. The callback is
registered when Lightning logs the model graph at fit start; with
``Trainer(enable_autolog_hparams=False)`` add it yourself: ``callbacks=[logger.callback]``.
Off nbdist engines (plain torchrun) the logger records nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger

from .. import state
from ..reporting.calls import report
from . import is_loss, loss_value, numbers, on_engine, whole


class BatchReporter(Callback):
    """Reports the step, loss and samples of every training batch (the logger's companion);
    does nothing off nbdist engines."""

    def __init__(self) -> None:
        self.enabled = on_engine()
        self.step = 0
        self.total: int | None = None
        self.live = False  # a batch was reported: the loss on the dashboard comes from here

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        try:
            total = trainer.estimated_stepping_batches
        except Exception:  # Lightning cannot always tell (varying accumulation)
            total = math.inf
        self.total = int(total) if math.isfinite(total) and total >= 1 else None
        self.live = False

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.step = trainer.global_step  # the optimizer step this batch counts towards

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.enabled:
            return
        loss = loss_value(outputs.get("loss") if isinstance(outputs, Mapping) else outputs)
        if loss is not None and pl_module.automatic_optimization:
            # the loss arrives divided by the accumulation, as backward() saw it
            accumulate = trainer.accumulate_grad_batches
            if accumulate != 1:
                loss = loss * accumulate
        self.live = self.live or loss is not None
        report(step=self.step, loss=loss, samples=batch_size(batch), total=self.total)


class LightningLogger(Logger):
    """A Lightning logger that sends metrics to nbdist's dashboard and run store.

    ``every_batch=False`` reports only what Lightning logs (every ``log_every_n_steps``).
    """

    def __init__(self, every_batch: bool = True) -> None:
        super().__init__()
        self.enabled = on_engine()
        self.every_batch = every_batch
        self.callback = BatchReporter()

    @property
    def name(self) -> str:
        return "nbdist"

    @property
    def version(self) -> str:
        """The nbdist run (which also names its checkpoint folder): Lightning's checkpoints go
        to ``default_root_dir/nbdist/<run>/checkpoints`` when this is the first logger."""
        return state.engine.run_key

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Report what Lightning logged; the loss only while no batch loss is reported."""
        if not self.enabled:
            return
        live = self.callback.live
        key = None if live else next((k for k in metrics if is_loss(str(k))), None)
        loss = loss_value(metrics[key]) if key is not None else None
        report(step=whole(step), loss=loss, **numbers(metrics, skip=key))

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """Hyperparameters are not recorded (the run store keeps the cell's options)."""

    def log_graph(self, model: Any, input_array: Any = None) -> None:
        """Lightning calls this on every rank at fit start: register the batch callback."""
        if not (self.enabled and self.every_batch) or not isinstance(model, LightningModule):
            return
        try:
            callbacks = model.trainer.callbacks
        except RuntimeError:  # a module not attached to a trainer
            return
        if self.callback not in callbacks:
            callbacks.append(self.callback)


def batch_size(batch: Any) -> int | None:
    """Rows of the first tensor in ``batch`` (a tensor, or nested tuples, lists and dicts)."""
    for _ in range(8):
        shape = getattr(batch, "shape", None)
        if shape is not None:
            return int(shape[0]) if len(shape) else 1
        if isinstance(batch, Mapping):
            batch = next(iter(batch.values()), None)
        elif isinstance(batch, (list, tuple)) and batch:
            batch = batch[0]
        else:
            return None
    return None
