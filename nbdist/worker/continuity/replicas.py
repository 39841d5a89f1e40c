"""Replicas that drifted apart, found and made one again: rank 0's state, everywhere.

A stop can fall between one rank's ``opt.step()`` and another's, so that one replica of a model
took a step the others did not. At the first cell after a stop, each data-parallel model's
replicas are compared across its group: a checksum of every parameter, buffer and optimizer
state tensor (its sum and its sum of squares, in float64), reduced to its minimum and maximum
over the ranks (two small all-reduces). Where they differ, every rank takes the group's first
rank's state: parameters, buffers, the optimizer's state and its hyperparameters (a learning
rate a scheduler moved), by broadcast. Rank 0's, not the last checkpoint's: it is the newest
consistent state there is, and a cell after a stop goes on from where training was, not from
where it was saved. Nothing is unpickled: the optimizer state's layout travels as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..state import namespace


def optimizers_of(model: torch.nn.Module) -> list[torch.optim.Optimizer]:
    """The person's optimizers of ``model``: those in the engine's namespace that step any of
    its parameters."""
    mine = {id(p) for p in model.parameters()}
    found: dict[int, torch.optim.Optimizer] = {}
    for value in list(namespace().values()):
        for obj in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(obj, torch.optim.Optimizer) and any(
                id(p) in mine for g in obj.param_groups for p in g["params"]
            ):
                found[id(obj)] = obj
    return list(found.values())


def agree(model: torch.nn.Module, optimizers: Sequence, group: dist.ProcessGroup) -> bool:
    """Whether every rank of ``group`` holds the same replica of ``model`` (and optimizers)."""
    mine = _checksum(model, optimizers)
    low, high = mine.clone(), mine.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=group)
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
    return bool(torch.equal(low, high))


def _checksum(model: torch.nn.Module, optimizers: Sequence) -> torch.Tensor:
    """Four numbers, the same size on every rank whatever it holds (so the all-reduces meet):
    how many tensors, how many optimizers, and the tensors' sums and sums of squares, each
    weighted by its place (a value moved from one tensor to another shows)."""
    device = _device(model)
    total = torch.zeros(2, dtype=torch.float64, device=device)
    n = 0
    for n, t in enumerate(_tensors(model, optimizers), start=1):
        d = t.detach().to(device=device, dtype=torch.float64)
        total += torch.stack([d.sum(), d.square().sum()]) * (1.0 + n / 1024)
    counts = torch.tensor([n, len(optimizers)], dtype=torch.float64, device=device)
    return torch.cat([counts, total])


def make_one(model: torch.nn.Module, optimizers: Sequence, group: dist.ProcessGroup) -> None:
    """Every rank of ``group`` takes its first rank's parameters, buffers and optimizer state."""
    first = dist.get_global_rank(group, 0)
    device = _device(model)
    with torch.no_grad():
        for t in (*model.parameters(), *model.buffers()):
            _broadcast(t.data, first, group, device)
    count = _broadcast_json(len(optimizers), first, group, device)
    for i in range(count):  # a rank that holds fewer takes the rest into nothing
        _broadcast_optimizer(optimizers[i] if i < len(optimizers) else None, first, group, device)


def _tensors(model: torch.nn.Module, optimizers: Sequence) -> Iterable[torch.Tensor]:
    yield from model.parameters()
    yield from model.buffers()
    for opt in optimizers:
        for state in _states(opt):
            yield from (v for _, v in sorted(state.items()) if isinstance(v, torch.Tensor))


def _device(model: torch.nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None and p.device.type == "cuda" else torch.device("cpu")


def _states(opt: torch.optim.Optimizer) -> list[dict]:
    """The optimizer's state of each parameter, in its parameters' order (empty where none)."""
    return [opt.state.get(p, {}) for g in opt.param_groups for p in g["params"]]


def _broadcast(t: torch.Tensor, first: int, group, device: torch.device) -> None:
    """``first``'s ``t`` into every rank's, through ``device`` (NCCL moves GPU tensors only)."""
    if t.device == device:
        dist.broadcast(t, first, group=group)
        return
    moved = t.to(device)
    dist.broadcast(moved, first, group=group)
    t.copy_(moved)


def _broadcast_optimizer(opt: torch.optim.Optimizer | None, first: int, group, device) -> None:
    """``first``'s optimizer state and hyperparameters, on every rank of ``group``: its layout
    as JSON, then each tensor (into scratch where a rank has no such optimizer, or another
    layout: every rank runs the same broadcasts, whatever it holds)."""
    if opt is None:
        opt = torch.optim.SGD([torch.zeros(0, device=device)], lr=0.0)  # scratch: dropped
    params = [p for g in opt.param_groups for p in g["params"]]
    layout = None
    if dist.get_rank() == first:
        layout = {
            "groups": [
                {k: v for k, v in g.items() if k != "params" and _plain(v)}
                for g in opt.param_groups
            ],
            "states": [
                {
                    k: ["tensor", list(v.shape), str(v.dtype).removeprefix("torch.")]
                    if isinstance(v, torch.Tensor)
                    else ["value", v]
                    for k, v in sorted(s.items())
                    if isinstance(v, torch.Tensor) or _plain(v)
                }
                for s in _states(opt)
            ],
        }
    layout = _broadcast_json(layout, first, group, device)
    for g, values in zip(opt.param_groups, layout["groups"], strict=False):
        g.update(values)
    missing = len(layout["states"]) - len(params)
    params += [torch.zeros(0, device=device) for _ in range(missing)]
    for p, described in zip(params, layout["states"], strict=False):  # first's, in order
        state = opt.state[p] if described else opt.state.get(p, {})
        for key, (kind, *rest) in described.items():
            if kind == "value":
                state[key] = rest[0]
                continue
            shape, dtype = rest
            t = state.get(key)
            want = getattr(torch, dtype)
            if not isinstance(t, torch.Tensor) or list(t.shape) != shape or t.dtype != want:
                where = p.device if shape else torch.device("cpu")  # Adam's step: a CPU scalar
                t = state[key] = torch.empty(shape, dtype=want, device=where)
            _broadcast(t, first, group, device)
        for key in [k for k in state if k not in described]:
            del state[key]


def _plain(v: object) -> bool:
    return isinstance(v, (bool, int, float, str, type(None))) or (
        isinstance(v, (list, tuple)) and all(isinstance(x, (bool, int, float)) for x in v)
    )


def _broadcast_json(value: object, first: int, group, device: torch.device) -> Any:
    """``value`` (on ``first``) as JSON bytes, broadcast: every rank's copy of it."""
    data = json.dumps(value).encode() if dist.get_rank() == first else b""
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.broadcast(size, first, group=group)
    buf = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    if dist.get_rank() == first:
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    dist.broadcast(buf, first, group=group)
    return json.loads(buf.cpu().numpy().tobytes().decode())
