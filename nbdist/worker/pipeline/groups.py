"""Pipeline replicas: the process groups of a pipeline with data parallelism.

With ``S`` stages on ``W`` ranks (``W`` a multiple of ``S``), replica ``r`` is ranks
``r*S .. r*S+S-1`` (its pipeline group: rank ``r*S+s`` holds stage ``s``), and stage ``s`` of
every replica forms a data-parallel group, in which that stage's gradients are averaged.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Layout(NamedTuple):
    """This rank's place in the pipeline replicas, and its two groups (``None``: the world)."""

    stage: int
    replica: int
    replicas: int
    pipe_group: Any
    dp_group: Any


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
    return Layout(stage, replica, replicas, pipe_groups[replica], dp_groups[stage])


def average_gradients(module: Any, lay: Layout) -> None:
    """Average ``module``'s gradients over the replicas: one all-reduce in the stage's group."""
    if lay.replicas == 1:
        return
    import torch
    import torch.distributed as dist

    by_dtype: dict = {}
    for p in module.parameters():
        if p.grad is not None:
            by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
    for grads in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=lay.dp_group)
        flat /= lay.replicas
        at = 0
        for g in grads:
            g.copy_(flat[at : at + g.numel()].view_as(g))
            at += g.numel()
