"""``prepare``'s ``sync=`` options: the modes, and what each needs, checked before anything moves.

``check_options`` turns ``prepare(model, opt, sync=..., sync_every=..., ...)`` into a
``SyncOptions`` (None for ``sync="ddp"``, which needs none), or a one-line ``UsageError`` that
names the allowed values and the fix. Gossip and async check their own options (``gossip``,
``asynchronous``); what all the modes that sync every ``sync_every`` steps share is checked here:
the optimizer that drives them, DDP, DiLoCo's outer optimizer, and a compression that sends
parameters (``fp16``/``bf16``), not gradients.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Real
from typing import Any

import torch

from ...errors import UsageError
from . import asynchronous, gossip

#: Values of ``sync``.
SYNCS = ("ddp", "local_sgd", "diloco", "gossip", "async")
#: DiLoCo's outer optimizer defaults (the paper's).
OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9


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
