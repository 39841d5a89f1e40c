"""Pipeline parallelism across engines: each rank holds one stage of a model too big for one.

``pipe = nbdist.pipeline(model, split=["2"], microbatches=4, loss_fn=F.mse_loss)`` cuts an
``nn.Sequential`` before each named layer; rank ``i`` keeps stage ``i`` (``pipe.stage``), and
``pipe.step(inputs, targets)`` runs the whole batch through every stage in microbatches
(``torch.distributed.pipelining``), leaving in each stage the gradients of one process training on
the whole batch, and returning the batch's mean loss on every rank. An ordinary optimizer over
``pipe.stage.parameters()`` then completes the step.

With more ranks than stages (a world size that is a multiple of the stages), the ranks form
pipeline replicas (``pipe.replica`` of ``pipe.replicas``; see ``pipeline_groups``): each replica
trains on the batch its own ranks are given, as DDP ranks do, and after the backward each stage's
gradients are averaged over the replicas, so the optimizer step keeps them identical. The loss
returned is the mean over the replicas.

Every bad input is a one-line ``UsageError`` raised on every rank before any communication, so a
cell fails the same way everywhere and no rank waits for a peer that gave up.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import UsageError
from . import context
from .pipeline_groups import Layout, average_gradients, layout

SCHEDULES = ("1f1b", "gpipe")


def _stages(model: Any, split: Sequence[str]) -> list[OrderedDict]:
    """The model's top-level layers grouped into stages, one group per split point plus one."""
    import torch.nn as nn

    if not isinstance(model, nn.Sequential):
        raise UsageError(
            f"pipeline splits an nn.Sequential, not a {type(model).__name__}: write the model as "
            "nn.Sequential(...) of layers that run in order"
        )
    if isinstance(split, str) or not all(isinstance(s, str) for s in split):
        raise UsageError(f"split must be a list of layer names, such as split=['2'], not {split!r}")
    names = [name for name, _ in model.named_children()]
    at = []
    for s in split:
        if s not in names:
            raise UsageError(
                f"split name {s!r} is not a layer of the model: name one of its top-level "
                f"layers {', '.join(names)}"
            )
        at.append(names.index(s))
    if at and at[0] == 0:
        raise UsageError(
            f"split {split[0]!r} is the first layer, which would leave stage 0 empty: "
            "name the layers where stages 1, 2, ... begin"
        )
    if at != sorted(set(at)):
        raise UsageError(
            f"split names {list(split)} must each appear once, in the model's layer order "
            f"({', '.join(names)})"
        )
    bounds = [0, *at, len(names)]
    children = list(model.named_children())
    return [OrderedDict(children[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]


def _check_layout(stages: int, world: int) -> None:
    """Whole pipeline replicas on the ranks, or the one-line fix."""
    if stages > world:
        raise UsageError(
            f"{stages} stages but {world} ranks: use at most {world - 1} split names, or start "
            f"a cluster with at least {stages} engines"
        )
    if world % stages:
        raise UsageError(
            f"{world} ranks cannot hold whole copies of {stages} stages: use a number of stages "
            f"that divides {world}"
        )


class Pipeline:
    """This rank's stage of a pipeline and the schedule that runs a batch through all stages."""

    def __init__(
        self,
        stage: Any,
        lay: Layout,
        num_stages: int,
        microbatches: int,
        loss_fn: Callable[[Any, Any], Any],
        schedule: str,
    ) -> None:
        self.stage = stage
        self.stage_index = lay.stage
        self.replica = lay.replica
        self.replicas = lay.replicas
        self._layout = lay
        self.num_stages = num_stages
        self.microbatches = microbatches
        self.schedule = schedule
        self._loss_fn = loss_fn
        self._runner: Any = None
        self._key: tuple | None = None

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1

    def __repr__(self) -> str:
        return (
            f"Pipeline(stage {self.stage_index} of {self.num_stages}, "
            f"replica {self.replica} of {self.replicas}, "
            f"microbatches={self.microbatches}, schedule={self.schedule!r})"
        )

    def _scaled_loss(self, output: Any, target: Any) -> Any:
        # Each microbatch's loss is divided by their number, so that backward accumulates the
        # gradient of the whole batch's mean loss, onto whatever gradients are already there (as
        # loss.backward() does); torch's own scale_grads would also divide earlier gradients.
        return self._loss_fn(output, target) / self.microbatches

    def _check_batch(self, inputs: Any, targets: Any) -> None:
        import torch

        for what, t in (("inputs", inputs), ("targets", targets)):
            if not isinstance(t, torch.Tensor) or t.dim() == 0:
                raise UsageError(
                    f"pipe.step takes {what} as a tensor with a batch dimension, not "
                    f"{type(t).__name__}: pass the same whole batch on every rank of a replica"
                )
        n = inputs.shape[0]
        if targets.shape[0] != n:
            raise UsageError(
                f"inputs hold {n} rows but targets {targets.shape[0]}: pass matching batches"
            )
        if n % self.microbatches:
            raise UsageError(
                f"a batch of {n} rows does not split into {self.microbatches} equal microbatches: "
                f"use a batch size that is a multiple of {self.microbatches}, or change "
                "microbatches"
            )

    def _schedule_for(self, inputs: Any) -> Any:
        """The torch schedule for this batch shape: built again when the shape changes, because a
        stage infers the shapes it sends and receives from its first microbatch."""
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        key = (tuple(inputs.shape), inputs.dtype)
        if self._runner is None or key != self._key:
            device = context.device()
            stage = PipelineStage(
                self.stage, self.stage_index, self.num_stages, device, group=self._layout.pipe_group
            )
            kind = ScheduleGPipe if self.schedule == "gpipe" else Schedule1F1B
            self._runner = kind(
                stage, self.microbatches, loss_fn=self._scaled_loss, scale_grads=False
            )
            self._key = key
        return self._runner

    def step(self, inputs: Any, targets: Any) -> float:
        """Forward and backward of one batch through every stage; the batch's mean loss.

        Call it on every rank of a replica with that replica's whole batch (stage 0 reads
        ``inputs``, the last stage ``targets``). Gradients accumulate in ``pipe.stage`` as
        ``loss.backward()`` would for the whole batch in one process (with replicas: for all the
        replicas' batches together), so zero them between steps, as usual. Returns the batch's
        mean loss, averaged over the replicas, on every rank.
        """
        import torch
        import torch.distributed as dist

        self._check_batch(inputs, targets)
        device = context.device()
        runner = self._schedule_for(inputs)
        losses: list = []
        if self.is_first and self.is_last:
            runner.step(inputs.to(device), target=targets.to(device), losses=losses)
        elif self.is_first:
            runner.step(inputs.to(device), return_outputs=False)
        elif self.is_last:
            runner.step(target=targets.to(device), losses=losses, return_outputs=False)
        else:
            runner.step(return_outputs=False)
        average_gradients(self.stage, self._layout)
        # The microbatch losses are already divided by their number: their sum is the mean. Only
        # each replica's last stage holds one: a sum over the world is the sum over replicas.
        total = torch.zeros((), dtype=torch.float64, device=device)
        if self.is_last:
            total += sum(loss.detach().double() for loss in losses)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(total)
        return float(total) / self.replicas


def pipeline(
    model: Any,
    split: Sequence[str],
    microbatches: int,
    loss_fn: Callable[[Any, Any], Any],
    schedule: str = "1f1b",
) -> Pipeline:
    """Cut ``model`` (an ``nn.Sequential``) before each layer named in ``split``; keep this
    rank's stage (rank ``i`` holds stage ``i % stages`` of replica ``i // stages``) on its device.

    ``loss_fn(output, target)`` should average over its rows (as torch's losses do by default):
    the microbatches' losses are averaged, so gradients and the loss are the whole batch's.
    ``schedule`` is ``"1f1b"`` (less activation memory) or ``"gpipe"``.
    """
    info = context.current()
    if schedule not in SCHEDULES:
        raise UsageError(f"unknown schedule {schedule!r}: use one of {', '.join(SCHEDULES)}")
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise UsageError(f"microbatches must be a whole number of at least 1, not {microbatches!r}")
    if not callable(loss_fn):
        raise UsageError(f"loss_fn must be a function of (output, target), not {loss_fn!r}")
    groups = _stages(model, split)
    _check_layout(len(groups), info.world_size)
    if schedule == "1f1b" and microbatches < len(groups):
        raise UsageError(
            f"schedule '1f1b' needs at least as many microbatches as stages ({len(groups)}), "
            f"not {microbatches}: raise microbatches, or use schedule='gpipe'"
        )
    import torch.nn as nn

    lay = layout(len(groups), info.world_size, info.rank)
    stage = nn.Sequential(groups[lay.stage]).to(context.device())
    return Pipeline(stage, lay, len(groups), microbatches, loss_fn, schedule)
