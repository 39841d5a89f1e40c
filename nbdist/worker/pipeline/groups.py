"""Pipeline replicas: the process groups of a pipeline with data parallelism.

With ``S`` stages on ``W`` ranks (``W`` a multiple of ``S``), replica ``r`` is ranks
``r*S .. r*S+S-1`` (its pipeline group: rank ``r*S+s`` holds stage ``s``), and stage ``s`` of
every replica forms a data-parallel group, in which that stage's gradients are averaged.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ...errors import UsageError


class Layout(NamedTuple):
    """This rank's place in the pipeline replicas, and its two groups (``None``: the world).
    ``dp`` is the number of ranks a stage's gradients are averaged over: the replicas, or on a
    mesh its ``dp`` size (the ``tp`` ranks of a replica hold parts of one stage, not copies)."""

    stage: int
    replica: int
    replicas: int
    pipe_group: Any
    dp_group: Any
    dp: int = 1


def layout(stages: int, world: int, rank: int) -> Layout:
    """This rank's stage and replica; with more than one replica, every rank creates every
    group (``new_group`` is collective over the world, in the same order everywhere)."""
    replicas = world // stages
    if replicas == 1:
        return Layout(rank, 0, 1, None, None)
    import torch.distributed as dist

    pipe_groups = [
        dist.new_group(list(range(r * stages, (r + 1) * stages))) for r in range(replicas)
    ]
    dp_groups = [dist.new_group(list(range(s, world, stages))) for s in range(stages)]
    stage, replica = rank % stages, rank // stages
    return Layout(stage, replica, replicas, pipe_groups[replica], dp_groups[stage], replicas)


def on_mesh(device_mesh: Any, stages: int, world: int) -> Layout:
    """This rank's stage and replica on a mesh from ``nbdist.mesh``: its stage is its ``pp``
    coordinate, its pipeline the ``pp`` group through it, and a stage's gradients are averaged
    over the ``dp`` group (replicas along ``tp`` hold shards of the same stage)."""
    from ..mesh import grid

    pp, dp = grid.size(device_mesh, "pp"), grid.size(device_mesh, "dp")
    if pp != stages:
        raise UsageError(
            f"the mesh has pp={pp} but the split makes {stages} stages: name {pp - 1} split "
            f"points, or make the mesh with pp={stages}"
        )
    names = list(device_mesh.mesh_dim_names)
    coords = dict(zip(names, device_mesh.get_coordinate(), strict=True))
    replica = 0
    for name in names:  # the other coordinates, flattened: which copy of the pipeline
        if name != "pp":
            replica = replica * grid.size(device_mesh, name) + coords[name]
    dp_group = device_mesh["dp"].get_group() if dp > 1 else None
    pipe_group = device_mesh["pp"].get_group()
    return Layout(coords["pp"], replica, world // stages, pipe_group, dp_group, dp)


def average_gradients(module: Any, lay: Layout) -> None:
    """Average ``module``'s gradients over the replicas: one all-reduce in the stage's group."""
    if lay.dp == 1:
        return
    import torch
    import torch.distributed as dist

    by_dtype: dict = {}
    for p in module.parameters():
        if p.grad is not None:  # a tensor-parallel shard's gradient: its own part
            grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            by_dtype.setdefault(grad.dtype, []).append(grad)
    for grads in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=lay.dp_group)
        flat /= lay.dp
        at = 0
        for g in grads:
            g.copy_(flat[at : at + g.numel()].view_as(g))
            at += g.numel()
