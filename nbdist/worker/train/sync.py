"""Local SGD, DiLoCo, gossip: ranks train on their own, sync every ``sync_every`` optimizer steps.

``prepare(model, opt, sync="local_sgd" | "diloco", sync_every=H)`` (``prepare``) attaches a
``Synchronizer`` to the model and the optimizer; the training loop stays as it is, because the
user's own ``opt.step()`` drives it through the optimizer's step hooks:

- Optimizer steps ``1 .. sync_warmup`` are synchronous: the DDP communication hook all-reduces
  gradients (compressed as ``compress=`` asks), so the ranks stay equal, as with ``sync="ddp"``.
- Afterwards the hook sends nothing: each rank steps on its own gradients. Right after optimizer
  step ``sync_warmup + k * H`` (k = 1, 2, ...) returns, the ranks synchronise:
  ``local_sgd`` sets every parameter to the mean over ranks (torch's ``average_parameters``);
  ``diloco`` (Douillard et al., 2023) takes ``delta = global - mean(local)``, steps the global
  parameters with an outer SGD with Nesterov momentum on ``delta`` (``outer_lr``,
  ``outer_momentum``) and sets every rank to them. Floating buffers (BatchNorm statistics) are
  averaged. All ranks hold the same bits afterwards: an all-reduce gives every rank the same
  result, and what follows is computed from equal inputs on every rank.
- With ``compress="fp16"``/``"bf16"``, what travels at a sync is ``global - local`` in 16 bits
  (differences are small, so 16 bits lose little of them), then divided by the world size.

Before each sync the ranks measure how far they drifted apart, and rank 0 reports it as a
``sync`` event (``drift``). The options are checked before anything moves (``sync_options``).

Checkpoints: the optimizer's ``state_dict()`` carries the synchroniser's state (steps taken,
syncs done, DiLoCo's global parameters and momentum) under ``STATE_KEY``, as tensors and plain
values, and its ``load_state_dict`` restores it; ``nbdist.checkpoint`` saves each rank's own
model and optimizer state for models and optimizers in these modes (``is_rank_local``), because
between syncs they differ from rank 0's.

``sync="gossip"`` (``topology="ring"``) works the same way, except that a sync mixes each rank
with its ring neighbours only, point to point (``gossip.Ring``), so ranks do not end it equal,
and measures the drift at every ``gossip.DRIFT_EVERY``-th sync only: see ``gossip``.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from ...errors import UsageError
from ..state import engine
from . import asynchronous, gossip
from .drift import Drift
from .sync_options import SyncOptions

#: The key of the synchroniser's state in the optimizer's state dict.
STATE_KEY = "nbdist_sync"


class Synchronizer:
    """Local SGD, DiLoCo or gossip for one DDP model and its optimizer (see the module)."""

    def __init__(
        self,
        ddp: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        opts: SyncOptions,
        reduce: Any,
    ) -> None:
        self.opts = opts
        self.model = ddp
        self.optimizer = optimizer
        self.reduce = reduce  # the warm-up's DDP communication hook; None: torch's default
        self.params = [p for p in ddp.parameters() if p.dtype.is_floating_point]
        self.buffers = [b for b in ddp.buffers() if b.dtype.is_floating_point]
        self.steps = 0  # optimizer steps taken
        self.syncs = 0
        self.global_params: list[torch.Tensor] | None = None  # diloco, and compressed local_sgd
        self.momentum: list[torch.Tensor] | None = None  # diloco's outer momentum
        self.ring = gossip.Ring(self.params + self.buffers) if opts.mode == "gossip" else None
        self.exchange = None  # async's: made last, once nothing here can fail
        every = gossip.DRIFT_EVERY if self.ring is not None else 1
        self.drift = Drift(self.params, opts.mode, measured_every=every)
        self.handles = [
            optimizer.register_step_pre_hook(self.before_step),
            optimizer.register_step_post_hook(self.after_step),
            optimizer.register_state_dict_post_hook(self.add_state),
            optimizer.register_load_state_dict_pre_hook(self.take_state),
        ]
        ddp.register_comm_hook(None, self.comm_hook)
        if opts.mode == "async":
            self.exchange = asynchronous.Exchange(
                self.params + self.buffers, opts.every, opts.max_staleness
            )

    @property
    def synchronous(self) -> bool:
        """True while the next optimizer step is one of the warm-up's synchronous ones."""
        return self.steps < self.opts.warmup

    def detach(self) -> None:
        """Stop driving the optimizer (a later ``prepare`` of the same optimizer replaces us)."""
        for h in self.handles:
            h.remove()
        if self.exchange is not None:
            self.exchange.close()

    # -- hooks --------------------------------------------------------------------------------
    def comm_hook(self, state, bucket):  # DDP's hook signature; no annotations (DDP checks them)
        """All-reduce gradients during the warm-up; afterwards keep this rank's own."""
        if self.synchronous and self.reduce is None:
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
                allreduce_hook,
            )

            return allreduce_hook(None, bucket)
        if self.synchronous:
            return self.reduce(state, bucket)
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    def before_step(self, optimizer, args, kwargs) -> None:
        """Remember the global parameters when the first local window starts."""
        needs_global = self.opts.mode == "diloco" or self.opts.wire is not None
        if needs_global and not self.synchronous and self.global_params is None:
            self.global_params = [p.detach().clone() for p in self.params]

    def after_step(self, optimizer, args, kwargs) -> None:
        """Count the step; synchronise after every ``every``-th step past the warm-up."""
        self.steps += 1
        local = self.steps - self.opts.warmup
        if self.exchange is not None:
            self.exchange.after_step(local)
        elif local > 0 and local % self.opts.every == 0:
            self.sync()

    def add_state(self, optimizer, state_dict: dict) -> dict:
        """The optimizer's state dict, plus ours (tensors and plain values only)."""
        state_dict[STATE_KEY] = {
            "mode": self.opts.mode,
            "steps": self.steps,
            "syncs": self.syncs,
            "global": self.global_params,
            "momentum": self.momentum,
            "async": None if self.exchange is None else self.exchange.state(),
        }
        return state_dict

    def take_state(self, optimizer, state_dict: dict) -> dict:
        """Restore our state from an optimizer state dict (and leave the rest to torch)."""
        ours = state_dict.pop(STATE_KEY, None)
        if ours is None:
            return state_dict
        if ours["mode"] != self.opts.mode:
            raise UsageError(
                f"this checkpoint was trained with sync={ours['mode']!r}: prepare with that"
            )
        self.steps, self.syncs = int(ours["steps"]), int(ours["syncs"])

        def here(ts):
            if ts is None:
                return None
            return [t.to(p.device, p.dtype) for t, p in zip(ts, self.params, strict=True)]

        self.global_params, self.momentum = here(ours["global"]), here(ours["momentum"])
        if self.exchange is not None and ours.get("async") is not None:
            self.exchange.load(ours["async"])
        return state_dict

    # -- the synchronisation ------------------------------------------------------------------
    @torch.no_grad()
    def sync(self) -> None:
        """Bring every rank to the same parameters (local SGD's mean, or DiLoCo's outer step),
        or gossip: each to the mean of itself and its neighbours."""
        t0 = time.perf_counter()
        measure = self.ring is None or gossip.measures_drift(self.syncs)
        drift = self.drift.measure() if measure else None
        t1 = time.perf_counter()
        if self.ring is not None:  # parameters and buffers, point to point
            self.ring.mix_()
        elif self.global_params is None:  # uncompressed local SGD: torch's own utility
            from torch.distributed.algorithms.model_averaging.utils import (
                average_parameters,
            )

            average_parameters(iter(self.params), None)
        else:
            deltas = [g - p for g, p in zip(self.global_params, self.params, strict=True)]
            self.mean_(deltas)
            if self.opts.mode == "diloco":
                self.outer_step(deltas)
            else:
                for g, d in zip(self.global_params, deltas, strict=True):
                    g.sub_(d)
            for p, g in zip(self.params, self.global_params, strict=True):
                p.copy_(g)
        if self.ring is None:
            self.mean_(self.buffers)
        self.syncs += 1
        self.drift.report(
            drift,
            syncs=self.syncs,
            steps=self.steps,
            drift_s=t1 - t0,
            sync_s=time.perf_counter() - t0,
        )

    def outer_step(self, deltas: list[torch.Tensor]) -> None:
        """DiLoCo's outer step on the global parameters, ``deltas`` as the gradient."""
        if self.momentum is None:
            self.momentum = [torch.zeros_like(d) for d in deltas]
        nesterov_(
            self.global_params,
            deltas,
            self.momentum,
            self.opts.outer_lr,
            self.opts.outer_momentum,
        )

    def mean_(self, tensors: list[torch.Tensor]) -> None:
        """Replace ``tensors`` by their mean over ranks, sent as ``opts.wire`` (one all-reduce)."""
        if not tensors:
            return
        flat = torch.cat([t.reshape(-1) for t in tensors])
        flat = flat.div_(dist.get_world_size()).to(self.opts.wire or flat.dtype)
        dist.all_reduce(flat)
        at = 0
        for t in tensors:
            t.copy_(flat[at : at + t.numel()].view_as(t))
            at += t.numel()


@torch.no_grad()
def nesterov_(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    bufs: list[torch.Tensor],
    lr: float,
    momentum: float,
) -> None:
    """One step of SGD with Nesterov momentum, in place (``torch.optim.SGD(nesterov=True)``'s
    arithmetic, with momentum buffers that start at zero)."""
    for p, g, m in zip(params, grads, bufs, strict=True):
        m.mul_(momentum).add_(g)
        p.sub_(g.add(m, alpha=momentum), alpha=lr)


def attach(
    ddp: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    opts: SyncOptions,
    reduce: Any,
) -> Synchronizer:
    """A ``Synchronizer`` for ``ddp`` driven by ``optimizer`` (replacing one it had)."""
    for plan in list(engine.training_plans.values()):
        old = getattr(plan, "sync", None)
        if old is not None and old.optimizer is optimizer:
            old.detach()
            plan.sync = None
    return Synchronizer(ddp, optimizer, opts, reduce)


def _owner(obj: Any) -> Synchronizer | None:
    for model, plan in list(engine.training_plans.items()):
        s = getattr(plan, "sync", None)
        if s is not None and (obj is model or obj is s.optimizer):
            return s
    return None


def is_rank_local(obj: Any) -> bool:
    """True for a model or optimizer whose state differs between ranks (local SGD, DiLoCo,
    gossip, async)."""
    return _owner(obj) is not None


def is_asynchronous(obj: Any) -> bool:
    """True for a model or optimizer trained with ``sync="async"``: its checkpoints are each
    rank's own, written without waiting for the others."""
    s = _owner(obj)
    return s is not None and s.exchange is not None
