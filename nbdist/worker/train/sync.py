"""Local SGD, DiLoCo, gossip: ranks train on their own, sync every ``sync_every`` optimizer steps.

``prepare(model, opt, sync="local_sgd" | "diloco", sync_every=H)`` (``training``) attaches a
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

Before each sync the ranks measure how far they drifted apart: the largest spread (max - min over
ranks) of a fixed sample of ``DRIFT_SAMPLE`` parameter elements, spread evenly over the tensors,
in one all-reduce (MAX) of twice that many floats. Rank 0 reports it as a ``sync`` event
(dashboard and run store), at most one every ``EVENT_INTERVAL`` seconds: an event covers the
syncs since the previous one (``syncs``) and carries their largest drift.

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

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Real
from typing import Any

import torch
import torch.distributed as dist

from ...errors import UsageError
from ..reporting.calls import event
from ..state import engine
from . import asynchronous, gossip

#: Values of ``sync``.
SYNCS = ("ddp", "local_sgd", "diloco", "gossip", "async")
#: DiLoCo's outer optimizer defaults (the paper's).
OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9
#: Parameter elements sampled to measure drift.
DRIFT_SAMPLE = 1024
#: Seconds between two ``sync`` events at least (syncs in between are folded into the next).
EVENT_INTERVAL = 0.5
#: The key of the synchroniser's state in the optimizer's state dict.
STATE_KEY = "nbdist_sync"


@dataclass(frozen=True)
class SyncOptions:
    """How the ranks synchronise (``prepare``'s ``sync=`` options, checked)."""

    mode: str
    every: int
    warmup: int = 0
    outer_lr: float = OUTER_LR
    outer_momentum: float = OUTER_MOMENTUM
    wire: torch.dtype | None = None  # what a sync's all-reduce sends; None: the parameters' dtype
    topology: str | None = None  # gossip's
    max_staleness: int | None = None  # async's (None: its default)


def _whole(name: str, value: Any, least: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise UsageError(f"{name} must be a whole number >= {least}, not {value!r}")


def _number(name: str, value: Any, shown: str, within: Callable[[float], bool]) -> float:
    ok = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not within(value):
        raise UsageError(f"{name} must be a number in {shown}, not {value!r}")
    return float(value)


def check_options(
    sync: str,
    *,
    optimizer: Any,
    strategy: str,
    compress: str | None,
    precision: str | None,
    sync_every: int | None,
    sync_warmup: int,
    outer_lr: float | None,
    outer_momentum: float | None,
    topology: str | None = None,
    mesh: Any = None,
    model: Any = None,
    max_staleness: int | None = None,
) -> SyncOptions | None:
    """``prepare``'s ``sync=`` options as ``SyncOptions`` (None for ``"ddp"``), or a one-line
    ``UsageError`` naming the allowed values, before anything moves."""
    if sync not in SYNCS:
        raise UsageError(f"sync must be one of {SYNCS}, not {sync!r}")
    if sync != "diloco" and (outer_lr, outer_momentum) != (None, None):
        raise UsageError(
            f"outer_lr and outer_momentum are DiLoCo's: use sync='diloco', not {sync!r}"
        )
    if sync != "gossip" and topology is not None:
        raise UsageError(f"topology= is gossip's: use sync='gossip', not {sync!r}")
    asynchronous.check_options(max_staleness, sync=sync, compress=compress, mesh=mesh, model=model)
    if sync == "ddp":
        if sync_every is not None or sync_warmup != 0:
            raise UsageError(
                "sync_every and sync_warmup apply to sync='local_sgd', 'diloco', 'gossip' or "
                "'async' (sync='ddp' synchronises every step)"
            )
        return None
    if sync_every is None:
        raise UsageError(
            f"sync={sync!r} needs sync_every=H: optimizer steps between syncs, e.g. 16"
        )
    _whole("sync_every", sync_every, 1)
    _whole("sync_warmup", sync_warmup, 0)
    lr = OUTER_LR if outer_lr is None else outer_lr
    lr = _number("outer_lr", lr, "(0, inf)", lambda v: v > 0)
    mom = OUTER_MOMENTUM if outer_momentum is None else outer_momentum
    mom = _number("outer_momentum", mom, "[0, 1)", lambda v: 0 <= v < 1)
    if optimizer is None:
        raise UsageError(f"sync={sync!r} needs the optimizer: prepare(model, opt, sync={sync!r})")
    if strategy != "ddp":
        raise UsageError(f"sync={sync!r} works with strategy='ddp' only, not {strategy!r}")
    if sync == "gossip":
        topology = gossip.check_options(topology, compress=compress, mesh=mesh, model=model)
    if compress == "powersgd":
        raise UsageError(
            f"sync={sync!r} sends parameters, not gradients: use compress='fp16' or 'bf16' (or "
            "None) with it; compress='powersgd' goes with sync='ddp'"
        )
    if precision == "fp16":
        raise UsageError(
            f"sync={sync!r} with precision='fp16' could skip an overflowing step on one rank only "
            "and leave the ranks out of step: use precision='bf16'"
        )
    wire = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(compress or "")
    return SyncOptions(sync, sync_every, sync_warmup, lr, mom, wire, topology, max_staleness)


class Synchronizer:
    """Local SGD, DiLoCo or gossip for one DDP model and its optimizer (see the module)."""

    def __init__(self, ddp: torch.nn.Module, optimizer: torch.optim.Optimizer, opts: SyncOptions,
                 reduce: Any) -> None:  # fmt: skip
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
        per = max(1, DRIFT_SAMPLE // max(1, len(self.params)))
        self.sample_at = [
            torch.linspace(0, p.numel() - 1, min(per, p.numel()), device=p.device).round().long()
            for p in self.params
        ]
        self.pending = (0, 0.0)  # syncs not yet reported, their largest drift
        self.last_event = -math.inf
        self.last_times = (0.0, 0.0)  # seconds: the last sync's drift sample, and the whole sync
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
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

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
        drift = self.drift() if measure else None
        t1 = time.perf_counter()
        if self.ring is not None:  # parameters and buffers, point to point
            self.ring.mix_()
        elif self.global_params is None:  # uncompressed local SGD: torch's own utility
            from torch.distributed.algorithms.model_averaging.utils import average_parameters

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
        self.last_times = (t1 - t0, time.perf_counter() - t0)
        self.report(drift)

    def outer_step(self, deltas: list[torch.Tensor]) -> None:
        """DiLoCo's outer step on the global parameters, ``deltas`` as the gradient."""
        if self.momentum is None:
            self.momentum = [torch.zeros_like(d) for d in deltas]
        nesterov_(self.global_params, deltas, self.momentum, self.opts.outer_lr,
                  self.opts.outer_momentum)  # fmt: skip

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

    def drift(self) -> float:
        """The largest spread over ranks of the sampled parameter elements (one all-reduce)."""
        if not self.params:
            return 0.0
        pairs = zip(self.params, self.sample_at, strict=True)
        v = torch.cat([p.detach().reshape(-1)[i].float() for p, i in pairs])
        both = torch.cat([v, -v])
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
        hi, neg_lo = both.split(v.numel())
        return float((hi + neg_lo).max())

    def report(self, drift: float | None) -> None:
        """Rank 0: a ``sync`` event, at most one per ``EVENT_INTERVAL`` (the rest folded in);
        ``drift`` None: not measured at this sync (gossip), folded into the next event."""
        if dist.get_rank() != 0:
            return
        n, worst = self.pending
        n, worst = n + 1, max(worst, drift or 0.0)
        now = time.monotonic()
        if drift is None or now - self.last_event < EVENT_INTERVAL:
            self.pending = (n, worst)
            return
        self.pending, self.last_event = (0, 0.0), now
        sample_s, sync_s = self.last_times
        tail = f" (largest of {n} syncs)" if n > 1 else ""
        if self.ring is not None:
            tail = f" (measured at every {gossip.DRIFT_EVERY}th sync)"
        event(
            "sync",
            f"{self.opts.mode} sync {self.syncs} after step {self.steps}: ranks drifted "
            f"{worst:.3g} apart{tail}",
            step=self.steps,
            drift=worst,
            syncs=n,
            sync_s=sync_s,
            drift_s=sample_s,
        )


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


def attach(ddp: torch.nn.Module, optimizer: torch.optim.Optimizer, opts: SyncOptions,
           reduce: Any) -> Synchronizer:  # fmt: skip
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
