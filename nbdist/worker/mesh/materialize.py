"""``nbdist.materialize(model)``: a model built on the meta device gets real weights, each rank
allocating only its own part (its tensor-parallel shards, its FSDP shard, its pipeline stage).

The pattern, for a model bigger than one rank::

    with torch.device("meta"):
        model = Transformer(cfg)                 # shapes only: no memory, no initialisation
    mesh = nbdist.mesh(dp=2, tp=2)
    model, opt = ...                             # tensor-parallel plan, FSDP, or pipeline stage
    nbdist.materialize(model)                    # each rank allocates and fills its own part

Initialisation does not depend on the layout: each module's weights are drawn from a generator
seeded by ``seed`` and the module's name, as a whole tensor one module at a time (the peak is
the largest single layer, never the model), and each rank keeps the part it holds. So one
process, ``dp``, ``tp``, ``pp`` and any mix of them start from the same weights, bit for bit, and
a run compared across layouts differs only by how it is trained.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

from ...errors import UsageError
from ..state import engine


def _seed_of(seed: int, name: str) -> int:
    """The seed of module ``name``'s weights: the same on every rank and in every layout."""
    return zlib.crc32(f"{seed}:{name}".encode()) & 0x7FFFFFFF


def _device() -> Any:
    import torch

    info = engine.rank_info
    return torch.device(info.device if info is not None else "cpu")


def _own_tensors(module: Any) -> list[tuple[str, str, Any]]:
    """(kind, name, tensor) of the parameters and buffers ``module`` holds itself."""
    own = [("param", n, p) for n, p in module.named_parameters(recurse=False)]
    own += [("buffer", n, b) for n, b in module.named_buffers(recurse=False) if b is not None]
    return own


def _full_size(t: Any) -> Any:
    """An uninitialised plain CPU tensor of ``t``'s whole (global) shape."""
    import torch

    return torch.empty(tuple(t.shape), dtype=t.dtype, device="cpu")


def _local_part(full: Any, target: Any) -> Any:
    """The part of the whole tensor ``full`` that ``target`` (a DTensor shard, or a plain
    tensor) holds on this rank, cut locally: every rank drew the same whole tensor."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(target, DTensor):
        local = distribute_tensor(
            full.to(target.device), target.device_mesh, target.placements, src_data_rank=None
        )
        return local.to_local()
    return full


def _fill(name: str, module: Any, seed: int, init: Callable | None) -> None:
    """Draw ``module``'s own tensors whole, seeded by its name, and keep this rank's part."""
    import torch

    own = _own_tensors(module)
    if not own:
        return
    reset = init if init is not None else getattr(module, "reset_parameters", None)
    if reset is None:
        raise UsageError(
            f"nbdist.materialize: module {name or 'the model'!r} ({type(module).__name__}) has "
            "weights but no reset_parameters(): pass init=fn, a function fn(module) that "
            "fills its weights"
        )
    real = {n: t for _, n, t in own}
    whole = {n: _full_size(t) for n, t in real.items()}
    for kind, n, _ in own:  # the module sees whole plain tensors while it initialises
        store = module._parameters if kind == "param" else module._buffers
        plain = whole[n]
        store[n] = torch.nn.Parameter(plain, requires_grad=False) if kind == "param" else plain
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(_seed_of(seed, name))
            reset() if init is None else init(module)
    finally:
        for kind, n, _ in own:
            store = module._parameters if kind == "param" else module._buffers
            store[n] = real[n]
    with torch.no_grad():
        for n, t in real.items():
            part = _local_part(whole[n], t)
            local = t.to_local() if hasattr(t, "to_local") else t
            local.copy_(part.to(local.device))


def materialize(model: Any, *, seed: int = 0, init: Callable | None = None) -> Any:
    """Give ``model``, built under ``torch.device("meta")``, real weights on this rank's device,
    allocating only what this rank holds; return it.

    Each module's weights are initialised by its ``reset_parameters()`` (torch's own layers all
    have one), or by ``init(module)`` for every module with weights when given (for modules
    without one, or buffers computed in ``__init__``, which the meta device does not keep).
    Call it after the layout is applied (the tensor-parallel plan, ``prepare(...,
    strategy="fsdp")`` or ``pipeline``), so each rank allocates its part only; the weights are
    those of ``seed``, whatever the layout (see the module's docstring).
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise UsageError(f"nbdist.materialize: seed must be a whole number, not {seed!r}")
    if init is not None and not callable(init):
        raise UsageError(f"nbdist.materialize: init must be a function fn(module), not {init!r}")
    target = getattr(model, "stage", None) if type(model).__name__ == "Pipeline" else model
    target = getattr(target, "module", target)  # DDP's wrapped model
    if not hasattr(target, "named_modules"):
        raise UsageError(
            f"nbdist.materialize takes a torch module (or a pipeline), not {type(model).__name__}"
        )
    target.to_empty(device=_device())
    for name, module in target.named_modules():
        _fill(name, module, seed, init)
    return model
