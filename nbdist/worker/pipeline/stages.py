"""Pipeline parallelism across engines: each rank holds one stage of a model too big for one.

``pipe = nbdist.pipeline(model, split=["2"], microbatches=4, loss_fn=F.mse_loss)`` cuts an
``nn.Sequential`` before each named layer (any other module is traced and cut before named
submodules: ``split``); rank ``i`` keeps stage ``i`` (``pipe.stage``), and
``pipe.step(inputs, targets)`` runs the whole batch through every stage in microbatches
(``torch.distributed.pipelining``), leaving in each stage the gradients of one process training on
the whole batch, and returning the batch's mean loss on every rank. An ordinary optimizer over
``pipe.stage.parameters()`` then completes the step.

With more ranks than stages (a world size that is a multiple of the stages), the ranks form
pipeline replicas (``pipe.replica`` of ``pipe.replicas``; see ``groups``): each replica
trains on the batch its own ranks are given, as DDP ranks do, and after the backward each stage's
gradients are averaged over the replicas, so the optimizer step keeps them identical. The loss
returned is the mean over the replicas.

Every bad input is a one-line ``UsageError`` raised on every rank before any communication, so a
cell fails the same way everywhere and no rank waits for a peer that gave up.

Measured on every step: ``pipe.last_step_time`` and ``pipe.idle_share``, the share of the step
this stage spent not computing (the pipeline's bubble, and waiting for its neighbours); the
dashboard shows both per rank, with the rank's stage. ``nbdist.checkpoint``/``nbdist.steps`` save
each rank's own stage (and the optimizers over it) and restore it to the rank holding that stage.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from ...errors import UsageError
from ...protocol import PipelineRole
from .. import context, groups, rendezvous
from ..mesh import grid
from ..state import engine
from .groups import Layout, average_gradients, layout, on_mesh
from .split import cut

SCHEDULES = ("1f1b", "gpipe")


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


class _ChunkClock:
    """Adds up the time a stage spends computing its chunks (the rest of a step it waits), by
    wrapping the runtime's two chunk methods. On a GPU, chunks are timed with CUDA events (a
    kernel runs after its launch returns), read once the step has ended."""

    def __init__(self, runtime: Any) -> None:
        self.busy, self.events = 0.0, []
        self._cuda = runtime.device.type == "cuda"
        for name in ("forward_one_chunk", "backward_one_chunk"):
            setattr(runtime, name, self._timed(getattr(runtime, name)))

    def start(self) -> None:
        self.busy, self.events = 0.0, []

    def seconds(self) -> float:
        return self.busy + sum(a.elapsed_time(b) for a, b in self.events) / 1000

    def _timed(self, run: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._cuda:
                import torch

                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                try:
                    return run(*args, **kwargs)
                finally:
                    b.record()
                    self.events.append((a, b))
            t = time.perf_counter()
            try:
                return run(*args, **kwargs)
            finally:
                self.busy += time.perf_counter() - t

        return timed


class Pipeline:
    """This rank's stage of a pipeline and the schedule that runs a batch through all stages."""

    def __init__(
        self,
        cut: Any,
        lay: Layout,
        microbatches: int,
        loss_fn: Callable[[Any, Any], Any],
        schedule: str,
    ) -> None:
        self._cut = cut
        self.stage = self._own(cut.module(lay.stage))
        """This rank's stage: a module of the model's own layers (and parameter objects)."""
        self.stage_index = lay.stage
        self.replica = lay.replica
        self.replicas = lay.replicas
        self._layout = lay
        self.num_stages = cut.num_stages
        self.microbatches = microbatches
        self.schedule = schedule
        self._loss_fn = loss_fn
        self._runner: Any = None
        self._clock: Any = None
        self._key: tuple | None = None
        self.last_step_time: float | None = None
        """Seconds the latest ``step`` took on this rank."""
        self.idle_share: float | None = None
        """The share of the latest ``step`` this stage spent not computing: the pipeline's
        bubble, and waiting for its neighbours and the replicas."""
        self.role = PipelineRole(lay.stage, cut.num_stages, lay.replica, lay.replicas)

    @staticmethod
    def _own(module: Any) -> Any:
        """``module`` on this rank's device (or still on the meta device, until
        ``materialize``), known to checkpoints as a stage (``holds_stage``)."""
        if not any(t.is_meta for t in [*module.parameters(), *module.buffers()]):
            module = module.to(context.device())
        engine.pipeline_parts.add(module)
        return module

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

    def state_dict(self) -> dict:
        """This rank's stage's state (``nbdist.checkpoint(model=pipe)`` saves it per rank)."""
        return self.stage.state_dict()

    def load_state_dict(self, state: dict) -> Any:
        return self.stage.load_state_dict(state)

    @property
    def layout(self) -> Layout:
        """This rank's place in the pipeline replicas, and its groups."""
        return self._layout

    def rebind(self, pipe_group: Any, dp_group: Any) -> None:
        """Run over this formation's groups (``continuity``): the schedule is made again at the
        next step, and what a half-done step accumulated is dropped."""
        self._layout = self._layout._replace(pipe_group=pipe_group, dp_group=dp_group)
        self._runner = self._key = None
        for p in self.stage.parameters():
            p.grad = None

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
        from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

        key = (tuple(inputs.shape), inputs.dtype)
        if self._runner is None or key != self._key:
            self._cut.module(self.stage_index, inputs[: len(inputs) // self.microbatches])
            runtime = self._cut.runtime(
                self.stage, self.stage_index, context.device(), self._layout.pipe_group
            )
            self._clock = _ChunkClock(runtime)
            kind = ScheduleGPipe if self.schedule == "gpipe" else Schedule1F1B
            self._runner = kind(
                runtime, self.microbatches, loss_fn=self._scaled_loss, scale_grads=False
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
        t0 = time.perf_counter()
        device = context.device()
        runner = self._schedule_for(inputs)
        self._clock.start()
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
        loss = float(total) / self.replicas  # waits for the device: the step has ended
        self.last_step_time = time.perf_counter() - t0
        busy = self._clock.seconds()
        self.idle_share = max(0.0, min(1.0, 1 - busy / self.last_step_time))
        engine.pipeline, engine.pipeline_idle = self.role, self.idle_share
        return loss


def holds_stage(obj: Any) -> bool:
    """True for a pipeline, or a module or optimizer holding parameters of a pipeline's stage on
    this engine (the stage, the whole model it was cut from, an optimizer over the stage): state
    that differs between a pipeline's ranks, which checkpoints save from every rank."""
    if isinstance(obj, Pipeline):
        return True
    if not engine.pipeline_parts:
        return False
    if callable(getattr(obj, "parameters", None)):
        params = list(obj.parameters())
    else:
        params = [p for g in getattr(obj, "param_groups", None) or () for p in g["params"]]
    mine = {id(p) for part in engine.pipeline_parts for p in part.parameters()}
    return any(id(p) in mine for p in params)


def pipeline(
    model: Any,
    split: Sequence[str],
    microbatches: int,
    loss_fn: Callable[[Any, Any], Any],
    schedule: str = "1f1b",
    example: Any = None,
    mesh: Any = None,
) -> Pipeline:
    """Cut ``model`` before each submodule named in ``split``; keep this rank's stage (rank ``i``
    holds stage ``i % stages`` of replica ``i // stages``) on its device.

    An ``nn.Sequential`` is cut between its top-level layers (``"2"``: before layer 2). Any other
    module is traced (``torch.export``) and cut before the submodules named as
    ``named_modules()`` names them (``"layers.2"``); it needs ``example``, a batch of inputs as
    ``pipe.step`` takes them. ``loss_fn(output, target)`` should average over its rows (as
    torch's losses do by default): the microbatches' losses are averaged, so gradients and the
    loss are the whole batch's. ``schedule`` is ``"1f1b"`` (less activation memory) or
    ``"gpipe"``.

    ``mesh=nbdist.mesh(pp=..., dp=..., tp=...)`` cuts the stages along the mesh's ``pp``
    dimension instead: a rank holds the stage of its ``pp`` coordinate, stages' gradients are
    averaged over ``dp``, and a stage may be split further over ``tp`` with ``nbdist.prepare(
    pipe.stage, mesh=mesh, plan=...)`` before the first step. A model built on the meta device
    stays there until ``nbdist.materialize(pipe)`` gives this rank's stage its weights.
    """
    info = context.current()
    if mesh is not None:
        grid.check(mesh, "nbdist.pipeline")
    if schedule not in SCHEDULES:
        raise UsageError(f"unknown schedule {schedule!r}: use one of {', '.join(SCHEDULES)}")
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise UsageError(f"microbatches must be a whole number of at least 1, not {microbatches!r}")
    if not callable(loss_fn):
        raise UsageError(f"loss_fn must be a function of (output, target), not {loss_fn!r}")
    stages = len(split) + 1 if isinstance(split, (list, tuple)) else 0
    if stages and mesh is not None:
        lay = on_mesh(mesh, stages, info.world_size)
    elif stages:  # what the ranks can hold, before any tracing
        _check_layout(stages, info.world_size)
    if schedule == "1f1b" and microbatches < stages:
        raise UsageError(
            f"schedule '1f1b' needs at least as many microbatches as stages ({stages}), "
            f"not {microbatches}: raise microbatches, or use schedule='gpipe'"
        )
    parts = cut(model, split, example, microbatches)
    if mesh is None:
        lay = layout(stages, info.world_size, info.rank)
    pipe = Pipeline(parts, lay, microbatches, loss_fn, schedule)
    engine.pipeline = pipe.role
    groups.track(pipe, "pipeline", rendezvous.formation())  # bound again after a stop
    return pipe
