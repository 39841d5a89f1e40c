"""Gossip (D-PSGD): every ``sync_every`` optimizer steps each rank mixes with its neighbours only.

``prepare(model, opt, sync="gossip", sync_every=H, topology="ring")`` trains as local SGD does
(``sync``: the warm-up, then no gradient all-reduce), but a sync is decentralised: no rank
waits for more than its neighbours, and no all-reduce moves a parameter.

Topology ``"ring"`` (the only one so far; ``TOPOLOGIES``): rank ``r`` of ``n`` has neighbours
``r - 1`` and ``r + 1`` (mod ``n``). A sync replaces every floating parameter and buffer by
``(left + own + right) / 3``: D-PSGD's mixing matrix for a ring (Lian et al., 2017), doubly
stochastic, 1/3 on the diagonal and on both neighbours. With 2 ranks the neighbours are one
rank and the weights are 1/2: ``(own + other) / 2``; with 1 rank there is nothing to mix. Unlike
local SGD the ranks do not end a sync equal: they contract towards their mean, which every sync
keeps (the matrix is doubly stochastic), and agree more the more syncs they make.

The exchange: per dtype, the tensors travel as one flat buffer; each rank posts its sends to
both neighbours and its receives from both together (``dist.batch_isend_irecv``: point to
point, on gloo and NCCL), so the two exchanges overlap, then waits for them. The arithmetic is
fixed, elementwise, in the tensors' own dtype and in that order (left, own, right, then the
division), so the result is exactly predictable from the ranks' parameters before the sync.

Drift (the ``sync`` event, ``drift.Drift.measure``): the largest spread over ranks (max -
min) of a sample of parameter elements: the farthest a rank is from the ranks' mean, on an
element, lies between half of it and all of it. Measuring it takes one all-reduce of
``2 * DRIFT_SAMPLE`` floats, a global barrier, so a gossip run measures it for the report only,
at syncs 1, ``1 + DRIFT_EVERY``, ... (the same syncs on every rank); it moves no parameter.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ...errors import UsageError
from ..state import engine

#: Values of ``topology``.
TOPOLOGIES = ("ring",)
#: Gossip measures the ranks' drift (one small all-reduce) at every this-many-th sync only.
DRIFT_EVERY = 10


def check_options(topology: str | None, *, compress: str | None, mesh: Any, model: Any) -> str:
    """``topology`` checked (default ``"ring"``), or one line naming what does not go with
    gossip: compression, a mesh, a pipeline's stage."""
    topology = "ring" if topology is None else topology
    if topology not in TOPOLOGIES:
        raise UsageError(f"topology must be one of {TOPOLOGIES}, not {topology!r}")
    if compress is not None:
        raise UsageError(
            f"sync='gossip' sends whole parameters to its neighbours, which 16 bits or a low "
            f"rank would blur at every sync: drop compress={compress!r} (or use sync='local_sgd')"
        )
    if mesh is not None:
        raise UsageError(
            "sync='gossip' mixes whole models over all ranks in a ring: prepare without mesh= "
            "(or use sync='ddp' on a mesh)"
        )
    if model in engine.pipeline_parts:
        raise UsageError(
            "sync='gossip' mixes whole models; a pipeline's stage is part of one: use "
            "sync='ddp' (the pipeline averages its stages' gradients itself)"
        )
    return topology


def measures_drift(syncs_done: int) -> bool:
    """Whether the sync after ``syncs_done`` earlier ones measures the drift (all ranks agree)."""
    return syncs_done % DRIFT_EVERY == 0


class Ring:
    """The ring's mixing step for a fixed list of tensors (parameters and floating buffers)."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.world, rank = dist.get_world_size(), dist.get_rank()
        self.left, self.right = (rank - 1) % self.world, (rank + 1) % self.world
        groups: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:
            groups.setdefault(t.dtype, []).append(t)
        self.groups = list(groups.values())
        self.scratch: list[tuple[torch.Tensor, ...]] | None = None  # own, left's, right's

    @torch.no_grad()
    def mix_(self) -> None:
        """Replace each tensor by the mean of itself and its neighbours' (see the module)."""
        if self.world == 1:
            return
        if self.scratch is None:  # made at the first sync: no memory for a run without one
            self.scratch = [
                tuple(ts[0].new_empty(sum(t.numel() for t in ts)) for _ in range(3))
                for ts in self.groups
            ]
        for ts, (own, from_left, from_right) in zip(self.groups, self.scratch, strict=True):
            torch.cat([t.detach().reshape(-1) for t in ts], out=own)
            ops = [
                dist.P2POp(dist.isend, own, self.left),
                dist.P2POp(dist.irecv, from_left, self.left),
            ]
            if self.world > 2:
                ops += [
                    dist.P2POp(dist.isend, own, self.right),
                    dist.P2POp(dist.irecv, from_right, self.right),
                ]
            for request in dist.batch_isend_irecv(ops):
                request.wait()
            if self.world == 2:
                mixed = own.add_(from_left).div_(2)
            else:
                mixed = from_left.add_(own).add_(from_right).div_(3)
            at = 0
            for t in ts:
                t.detach().copy_(mixed[at : at + t.numel()].view_as(t))
                at += t.numel()
