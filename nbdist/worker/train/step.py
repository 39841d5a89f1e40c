"""``with nbdist.train_step(model, opt) as step:`` one micro-step of training, as ``prepare`` set
the model up: gradient accumulation (no all-reduce on the first ``k - 1`` micro-steps), loss
scaling under fp16, and the optimizer's step and zeroing when the step syncs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from ...errors import UsageError
from ..state import engine


@dataclass
class Plan:
    """What ``train_step`` needs to know about a prepared model (kept beside it, not on it:
    ``engine.training_plans``), set by ``prepare``."""

    accumulate: int = 1
    scaler: Any = None  # torch.amp.GradScaler for fp16
    sync_first: bool = False  # static-graph DDP must all-reduce in its first backward
    micro: int = 0  # micro-steps taken so far
    sync: Any = None  # a sync.Synchronizer: local SGD or DiLoCo


class Step:
    """One micro-step inside ``train_step``: call ``backward(loss)`` once."""

    def __init__(self, plan: Plan, syncs: bool):
        self.syncs = syncs
        """True when this micro-step all-reduces gradients and steps the optimizer."""
        self._plan = plan
        self.backward_done = False

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate ``loss``: divided by ``accumulate``, and scaled under fp16."""
        if self._plan.accumulate > 1:
            loss = loss / self._plan.accumulate
        if self._plan.scaler is not None:
            loss = self._plan.scaler.scale(loss)
        loss.backward()
        self.backward_done = True


@contextlib.contextmanager
def train_step(model, optimizer, *, sync: bool | None = None) -> Iterator[Step]:
    """One micro-step of training: run the forward and ``step.backward(loss)`` inside.

    With ``accumulate=k`` (see ``prepare``), the first ``k - 1`` micro-steps of every ``k`` run
    their forward and backward inside ``no_sync`` (gradients add up locally, nothing is sent)
    and the ``k``-th all-reduces the sum and steps the optimizer. On leaving a step that syncs,
    the optimizer steps (through the gradient scaler under fp16) and the gradients are zeroed.
    ``sync=True`` forces a step now, e.g. for the last, partial group of an epoch. Works with
    any model; one that ``prepare`` did not wrap steps every time.
    """
    plan = engine.training_plans.get(model) or Plan()
    plan.micro += 1
    syncs = sync if sync is not None else plan.micro % plan.accumulate == 0
    if syncs:
        plan.micro = 0
    # A static-graph DDP learns its graph in its first backward, which must all-reduce; doing it
    # early changes nothing: averaging gradients that are already equal on all ranks is a no-op.
    skip_reduce = not syncs and not plan.sync_first
    plan.sync_first = False
    step = Step(plan, syncs)
    with _no_sync(model) if skip_reduce else contextlib.nullcontext():
        yield step
    if not step.backward_done:
        raise UsageError(
            "call step.backward(loss) inside `with nbdist.train_step(...) as step:` "
            "(not loss.backward(): the step scales the loss for accumulation and fp16)"
        )
    if syncs:
        if plan.scaler is not None:
            plan.scaler.step(optimizer)
            plan.scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)


@contextlib.contextmanager
def _no_sync(model) -> Iterator[None]:
    """No gradient all-reduce inside: DDP's ``no_sync``, or FSDP's gradient-sync switch."""
    if isinstance(model, DistributedDataParallel):
        with model.no_sync():
            yield
        return
    set_sync = getattr(model, "set_requires_gradient_sync", None)  # FSDP2 (fully_shard)
    if set_sync is None:
        yield
        return
    set_sync(False)
    try:
        yield
    finally:
        set_sync(True)
