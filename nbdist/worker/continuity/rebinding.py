"""The pass at the start of a cell: what the last formation made, bound to this one.

Run by the runner at the start of a cell that runs on every rank of the world
(``CellRequest.rebind``), after its group formed and before its code: the same objects, in the
order they were made, on every rank (SPMD), so the collectives it needs meet. Once per
formation (nothing to do while the same one stands):

1. the groups the last formation made beside its default one are made again, in order, so each
   has the name it had and device meshes find them (``groups.remake``), when every rank holds
   that formation's record (agreed in one all-reduce: a fresh engine holds none, a world of
   another size cannot make them; a DDP model keeps its world's group, or its shared-memory
   group, made anew, all the same);
2. each object is handed the new group of the name its old one had: a DDP model (``ddp``), an
   FSDP module (``fsdp``); one whose group cannot be made again is named in one line, and left;
3. each data-parallel model's replicas are compared and, where they drifted apart, made one
   again from the group's first rank (``replicas``), said in one line; not a model trained
   with ``sync=`` local SGD, DiLoCo, gossip or async, whose replicas differ by design until
   they next meet: its ranks' step counts are made one instead, so that they meet at the same
   step.
"""

from __future__ import annotations

import gc
import zlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from .. import context, groups, rendezvous
from ..collectives import group as local
from ..state import engine, namespace
from ..train import sync
from . import ddp, fsdp, replicas


def at_cell_start() -> list[str]:
    """Bind every object made over an earlier formation to this one; the lines to show."""
    current = rendezvous.formation()
    if not dist.is_initialized() or engine.rebound == current:  # nothing formed since
        return []
    engine.rebound = current
    log, engine.previous_groups = engine.previous_groups, None
    gc.collect()  # what a rank has let go of is gone on every rank: the same objects remain
    stale = [b for b in engine.bound if b.ref() is not None and b.formation != current]
    same, remakes, shm = _agree(log, stale)
    remade = groups.remake(log) if remakes else {}
    for g in remade.values():
        if isinstance(g, local.LocalGroup):
            engine.local_group = g
    if shm and engine.local_group is None:  # every rank makes it, or none: a collective
        local.make()
    if not same:  # a fresh engine holds none of them (replay makes them again): left as they are
        return []
    lines: list[str] = []
    for bound in stale:
        lines += _rebind(bound, current, remade)
    return lines


def _agree(log: groups.Log | None, stale: list[groups.Bound]) -> tuple[bool, bool, bool]:
    """What every rank can do together, agreed in one all-reduce: whether they hold the same
    objects to bind (a fresh engine holds none), whether they hold the last formation's groups
    to make again (a fresh engine holds none; a world of another size cannot make them), and
    whether any needs this formation's shared-memory group (making it is a collective)."""
    n = (
        zlib.crc32(repr([(m.name, sorted(m.kwargs)) for m in log.made]).encode()) + 1
        if (groups.same_world(log) and log.made)
        else 0
    )
    sig = zlib.crc32("|".join(_signature(b) for b in stale).encode())
    shm = any(
        b.origin == "local" or isinstance(getattr(b.ref(), "process_group", None), local.LocalGroup)
        for b in stale
    )
    mine = torch.tensor([n, -n, sig, -sig, -int(shm)], dtype=torch.int64, device=context.device())
    dist.all_reduce(mine, op=dist.ReduceOp.MIN)
    low, high, sig_low, sig_high, shm_any = (int(v) for v in mine)
    return sig_low == -sig_high, low == -high > 0, shm_any < 0


def _signature(bound: groups.Bound) -> str:
    """An object to bind, as every rank that holds it describes it: its kind and its size."""
    obj = bound.ref()
    module = getattr(obj, "module", obj)
    numel = sum(p.numel() for p in module.parameters()) if hasattr(module, "parameters") else 0
    return f"{bound.kind}:{numel}"


def _rebind(bound: groups.Bound, current: tuple[int, int], remade: dict) -> list[str]:
    """Bind one object to this formation; the lines to show (why it cannot be, or its
    replicas made one again)."""
    obj = bound.ref()
    if obj is None or bound.note:
        return []
    lines: list[str] = []
    if isinstance(obj, DistributedDataParallel):
        new = _group_for(obj.process_group, remade, bound.origin)
        if new is None:
            bound.note = _cannot(obj, "DDP model")
            return [bound.note]
        ddp.rebind(obj, new)
        if not sync.is_rank_local(obj):  # local SGD's, gossip's... differ by design
            lines += _replicas(obj, new)
        else:
            _realign(obj)
    elif bound.kind == "pipeline":
        pipe, dp = (_renamed(g, remade) for g in (obj.layout.pipe_group, obj.layout.dp_group))
        if pipe is False or dp is False:
            bound.note = _cannot(obj, "pipeline")
            return [bound.note]
        obj.rebind(pipe, dp)
    elif bound.kind == "fsdp":
        try:
            fsdp.rebind(obj)
        except (RuntimeError, KeyError, ValueError) as exc:  # a group not made again
            bound.note = _cannot(obj, f"FSDP module: {type(exc).__name__}")
            return [bound.note]
    bound.formation = current
    return lines


def _realign(model: DistributedDataParallel) -> None:
    """A model trained with ``sync=``: its ranks count their steps alike again, at the furthest
    one's count (a stop between the ranks' steps left one a step ahead: it would synchronise at
    its k-th step, the others a step later, each waiting for the other)."""
    plan = engine.training_plans.get(model)
    synchronizer = getattr(plan, "sync", None)
    if synchronizer is None or synchronizer.exchange is not None:  # async: nothing to meet
        return
    counts = torch.tensor(
        [synchronizer.steps, synchronizer.syncs], dtype=torch.int64, device=context.device()
    )
    dist.all_reduce(counts, op=dist.ReduceOp.MAX)
    synchronizer.steps, synchronizer.syncs = (int(v) for v in counts)


def _group_for(old: dist.ProcessGroup, remade: dict, origin: str) -> dist.ProcessGroup | None:
    """The group of this formation that takes ``old``'s place (or, for an object brought back
    from a kept state, its ``origin``'s): the default group for the last default one, this
    formation's shared-memory group for the last one, the group made again under the old one's
    name for any other; None when there is none."""
    name = origin or _name(old)
    if name in remade:
        return remade[name]
    if origin == "local" or isinstance(old, local.LocalGroup):
        shared = engine.local_group
        return shared if shared is not None and shared.exchange is not None else dist.group.WORLD
    if name == _name(dist.group.WORLD):
        return dist.group.WORLD
    return None


def _renamed(old, remade: dict):
    """The group made again under ``old``'s name (None stays None: the world's); False when
    there is none."""
    return None if old is None else remade.get(_name(old), False)


def _name(group: dist.ProcessGroup) -> str:
    try:
        return group.group_name
    except (RuntimeError, AttributeError):
        return ""


def _replicas(model: DistributedDataParallel, group: dist.ProcessGroup) -> list[str]:
    optimizers = replicas.optimizers_of(model)
    if replicas.agree(model.module, optimizers, group):
        return []
    replicas.make_one(model.module, optimizers, group)
    if dist.get_rank(group) != 0:
        return []
    return [
        f"nbdist: the replicas of {_what(model)} differed (a stop fell between the ranks' steps, "
        "or a rank came back as it was before the cell): every rank now holds rank 0's "
        "parameters and optimizer state"
    ]


def _what(model) -> str:
    """How the person calls ``model``: its name in the engine's namespace, or its class."""
    for name, value in list(namespace().items()):
        if value is model:
            return repr(name)
    return f"a {type(getattr(model, 'module', model)).__name__} model"


def _cannot(model, what: str) -> str:
    return (
        f"nbdist: {_what(model)} ({what}) was made over a group of the last formation that "
        f"this one ({dist.get_world_size()} ranks) cannot make again: prepare it again"
    )
