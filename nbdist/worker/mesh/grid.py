"""``nbdist.mesh(dp=, tp=, pp=)``: the cluster's ranks as a torch ``DeviceMesh``.

The dimensions are laid out ``pp`` outermost, then ``dp``, then ``tp`` innermost, as torchtitan
and Megatron do: the ranks of one tensor-parallel group are consecutive, so on GPU hosts they
share a host (and its NVLink), where tensor parallelism's per-layer collectives belong; pipeline
stages, which exchange only activations, may span hosts. Any subset may be named; the product
of the sizes is the number of ranks. Each dimension's process group is made once per process
group: asking again for the same mesh in a later cell returns the same mesh.

What each dimension buys: ``dp`` more samples per step (each replica its own batch),
``tp`` layers bigger than one rank (each matrix split across the group, with collectives
inside every layer), ``pp`` models deeper than one rank (stages, with the bubble of a pipeline).
"""

from __future__ import annotations

from typing import Any

from ...errors import UsageError
from ...protocol import MESH_DIMENSIONS, MeshCoords
from .. import context
from ..state import engine


def _check_sizes(sizes: dict[str, Any], world: int) -> dict[str, int]:
    """The named sizes, outermost first; one line naming the fix when they do not fit."""
    named = {k: v for k, v in sizes.items() if v is not None}
    if not named:
        raise UsageError(
            f"nbdist.mesh: name at least one dimension, e.g. nbdist.mesh(dp=2, tp={world // 2})"
            if world % 2 == 0 and world > 1
            else f"nbdist.mesh: name at least one dimension, e.g. nbdist.mesh(dp={world})"
        )
    for name, size in named.items():
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise UsageError(f"nbdist.mesh: {name} must be a whole number >= 1, not {size!r}")
    product = 1
    for size in named.values():
        product *= size
    if product != world:
        shape = " × ".join(f"{k}={v}" for k, v in named.items())
        raise UsageError(
            f"nbdist.mesh: {shape} makes {product} ranks, but the cluster has {world}: choose "
            f"sizes whose product is {world}, or start a cluster of {product} engines"
        )
    return {k: named[k] for k in MESH_DIMENSIONS if k in named}


def mesh(dp: int | None = None, tp: int | None = None, pp: int | None = None) -> Any:
    """This cluster's ranks as a ``torch.distributed.device_mesh.DeviceMesh`` with the named
    dimensions (``mesh["tp"]``, ``mesh["dp"]``, ``mesh["pp"]``), on each rank's device.

    Call it on every rank, with the same sizes (it forms each dimension's process group).
    Apply torch's tensor-parallel plans to ``mesh["tp"]`` (or pass ``plan=`` to
    ``nbdist.prepare``), make ``dp`` data parallel with ``nbdist.prepare(model, opt,
    mesh=mesh)`` and cut stages along ``pp`` with ``nbdist.pipeline(..., mesh=mesh)``.
    ``%nbdist status`` and the dashboard show each rank's coordinates.
    """
    info = context.current()
    shape = _check_sizes({"pp": pp, "dp": dp, "tp": tp}, info.world_size)
    if engine.trial is not None:
        raise UsageError(
            "nbdist.mesh: a sweep's trials each train on their own ranks, not on one mesh: run "
            "the mesh in a %%distributed cell without --sweep"
        )
    import torch.distributed as dist

    if not dist.is_initialized():
        raise UsageError(
            "nbdist.mesh: no process group on this rank: call it inside a %%distributed cell"
        )
    key = (tuple(shape.items()), id(dist.group.WORLD))
    made = engine.meshes.get(key)
    if made is None:
        from torch.distributed.device_mesh import init_device_mesh

        device = context.device().type
        made = init_device_mesh(device, tuple(shape.values()), mesh_dim_names=tuple(shape))
        engine.meshes = {key: made}  # a mesh of an earlier group is let go of
    engine.mesh = coordinates(made)
    return made


def coordinates(device_mesh: Any) -> MeshCoords:
    """This rank's place in ``device_mesh``, as the notebook shows it."""
    names = tuple(device_mesh.mesh_dim_names or ())
    return MeshCoords(
        names=names,
        sizes=tuple(int(device_mesh.size(i)) for i in range(len(names))),
        coords=tuple(int(c) for c in device_mesh.get_coordinate() or ()),
    )


def size(device_mesh: Any, name: str) -> int:
    """The size of ``device_mesh``'s dimension ``name`` (1 when it has none)."""
    names = tuple(device_mesh.mesh_dim_names or ())
    return int(device_mesh.size(names.index(name))) if name in names else 1


def check(device_mesh: Any, where: str) -> None:
    """One line unless ``device_mesh`` is a mesh from ``nbdist.mesh`` (named dimensions)."""
    names = getattr(device_mesh, "mesh_dim_names", None)
    if not names or not set(names) <= set(MESH_DIMENSIONS):
        raise UsageError(
            f"{where}: mesh= takes the mesh nbdist.mesh(dp=..., tp=..., pp=...) returns, not "
            f"{type(device_mesh).__name__}" + (f" with dimensions {list(names)}" if names else "")
        )
