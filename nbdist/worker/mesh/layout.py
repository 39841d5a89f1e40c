"""What ``nbdist.prepare(model, opt, mesh=mesh, plan=plan)`` does with a mesh, before its data
parallelism: checks (one line each, before any communication), the tensor-parallel plan over
``mesh["tp"]``, and the ``dp`` dimension's group for DDP or FSDP.

Order, for a model on the meta device or not: the plan turns the named layers' weights into
``tp`` shards; FSDP (``strategy="fsdp"``) then shards what remains over ``dp``; a meta model
is materialised (``materialize``) once its layout is known, so each rank allocates only its
part; DDP then wraps it over ``dp``, or with tensor parallelism torch's FSDP2-based
``replicate`` (DDP cannot keep DTensor weights: see ``replicate``). With ``pp`` in the
mesh, ``prepare`` takes a pipeline's stage: it applies the plan, and the pipeline averages the
stage's gradients over ``dp`` itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import UsageError
from . import grid, plans


@dataclass(frozen=True)
class OnMesh:
    """A prepared model's place on the mesh, as ``prepare`` uses it."""

    mesh: Any
    dp: int  # data-parallel replicas (1: none)
    tp: int  # tensor-parallel ranks (1: none)
    pp: int  # pipeline stages (1: none)

    @property
    def dp_mesh(self) -> Any:
        return self.mesh["dp"] if self.dp > 1 else None

    @property
    def dp_group(self) -> Any:
        """The process group DDP averages over (None: no data parallelism on this mesh)."""
        return self.mesh["dp"].get_group() if self.dp > 1 else None


def check(
    mesh: Any, plan: Any, model: Any, *, strategy: str, sync: str, compress: str | None
) -> OnMesh | None:
    """The mesh ``prepare`` lays the model on (None without one), or one line naming what
    does not go together."""
    if mesh is None:
        if plan is not None:
            raise UsageError(
                "nbdist.prepare: plan= applies over a mesh's tp dimension: pass mesh=nbdist.mesh"
                "(dp=..., tp=...) too"
            )
        return None
    grid.check(mesh, "nbdist.prepare")
    on = OnMesh(mesh, grid.size(mesh, "dp"), grid.size(mesh, "tp"), grid.size(mesh, "pp"))
    if plan is not None:
        if "tp" not in (mesh.mesh_dim_names or ()):
            raise UsageError("nbdist.prepare: plan= needs a mesh with a tp dimension")
        plans.check(model, plan)
    if sync != "ddp" and (on.tp > 1 or on.pp > 1):
        raise UsageError(
            f"nbdist.prepare: sync={sync!r} averages whole models between steps; with tp or pp "
            "each rank holds a part of the model: use sync='ddp' (the default) on this mesh"
        )
    if compress is not None and on.tp > 1:
        raise UsageError(
            "nbdist.prepare: compress= is for DDP's gradient buckets of whole weights; with tp "
            "the weights are shards: drop compress, or use a mesh without tp"
        )
    if on.pp > 1 and strategy == "fsdp":
        raise UsageError(
            "nbdist.prepare: with pp, nbdist.pipeline averages each stage's gradients over dp; "
            "use strategy='ddp' (the default) to prepare a stage"
        )
    return on


def tensor_parallel(model: Any, on: OnMesh, plan: dict | None) -> Any:
    """``model`` with ``plan`` applied over ``mesh["tp"]`` (checked already); unchanged without."""
    return model if plan is None else plans.apply(model, on.mesh["tp"], plan)


def is_meta(model: Any) -> bool:
    """Whether ``model`` still has weights on the meta device (shapes only, no memory)."""
    return any(t.is_meta for t in [*model.parameters(), *model.buffers()])


def has_shards(model: Any) -> bool:
    """Whether some of ``model``'s weights are DTensors (tensor-parallel or FSDP shards)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def broadcast_weights(model: Any, group: Any) -> None:
    """Every rank of ``group`` (None: the world) starts from its first rank's weights (each
    tensor-parallel shard from the first rank holding the same shard), as DDP does."""
    import torch
    import torch.distributed as dist

    first = dist.get_global_rank(group, 0) if group is not None else 0
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t.to_local() if hasattr(t, "to_local") else t, src=first, group=group)


def replicate(model: Any, dp_mesh: Any, policy: Any) -> Any:
    """``model``, whose weights are tensor-parallel DTensors, made data parallel over
    ``dp_mesh`` with torch's FSDP2-based ``replicate``: each child with weights a unit (its
    gradients all-reduced while the backward goes on), then the root. DDP cannot hold DTensor
    weights: over tensor parallelism its ``_pre_dp_module_transform`` turns them into plain
    attributes after the first forward, out of ``parameters()`` and ``state_dict()``."""
    from torch.distributed._composable.replicate_with_fsdp import replicate as torch_replicate

    broadcast_weights(model, dp_mesh.get_group())
    for child in model.children():
        if any(True for _ in child.parameters()):
            torch_replicate(child, mesh=dp_mesh, mp_policy=policy)
    torch_replicate(model, mesh=dp_mesh, mp_policy=policy)
    return model


def rebind(optimizer: Any, names: dict[int, str], model: Any) -> None:
    """Point ``optimizer`` at the parameters (shards) that replaced, in ``model``, those it was
    built on (``names``: their names, by id); nothing when none was replaced."""
    if optimizer is None:
        return
    new = dict(model.named_parameters())
    moved = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            now = new.get(names.get(id(p), ""))
            if now is not None and now is not p:
                moved[id(p)] = now
    if not moved:
        return
    if optimizer.state:
        raise UsageError(
            "nbdist.prepare: pass a fresh optimizer (this one has taken steps already), or "
            "build it after prepare on the returned model's parameters: FSDP, a plan and a "
            "meta model give the model new parameters"
        )
    for group in optimizer.param_groups:
        group["params"] = [moved.get(id(p), p) for p in group["params"]]
