"""An FSDP module (torch's ``fully_shard``) bound to a new formation of its group, in place.

FSDP finds its groups through its device mesh, which finds them by name, and keeps them in each
parameter group's mesh information, made once. ``rebind`` reads them again from the mesh (whose
groups the new formation made again under their names: ``groups.remake``), and resets the
iteration a stop left half-done (torch's ``reset_iter_state``: parameters resharded, in-flight
gradients dropped), then drops the gradients. Its sharded parameters and their optimizer are
the person's own objects, untouched.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist


def rebind(root: torch.nn.Module) -> None:
    """Bind the FSDP module ``root`` (and every FSDP module in it) to this formation's groups."""
    from torch.distributed.fsdp import FSDPModule

    states = [m._get_fsdp_state() for m in root.modules() if isinstance(m, FSDPModule)]
    for state in states:
        for group in state._fsdp_param_groups:
            for info in _mesh_infos(group):
                _reread(info)
    if isinstance(root, FSDPModule) and root._get_fsdp_state()._is_root:
        with contextlib.suppress(RuntimeError):  # works of the aborted group: not waited on
            root.reset_iter_state()
    for p in root.parameters():
        p.grad = None


def _mesh_infos(group) -> list:
    """The mesh informations a parameter group and its parameters hold (often one object)."""
    infos = [group.mesh_info, group.post_forward_mesh_info]
    for param in group.fsdp_params:
        infos += [param.mesh_info, getattr(param, "post_forward_mesh_info", None)]
    unique: dict[int, object] = {id(i): i for i in infos if i is not None}
    return list(unique.values())


def _reread(info) -> None:
    """The groups of a mesh information, read again from its mesh."""
    mesh = info.mesh
    _refresh_registry(mesh)
    if getattr(info, "shard_mesh_dim", None) is not None:
        info.shard_process_group = mesh.get_group(info.shard_mesh_dim)
        info.shard_mesh_rank = info.shard_process_group.rank()
        if info.reduce_scatter_process_group is not None:
            info.reduce_scatter_process_group = _same_name(info.reduce_scatter_process_group)
    if getattr(info, "replicate_mesh_dim", None) is not None:
        info.replicate_process_group = mesh.get_group(info.replicate_mesh_dim)
        info.replicate_mesh_rank = info.replicate_process_group.rank()


def _refresh_registry(mesh) -> None:
    """A device mesh's own table of its groups (what compiled code reads), read again."""
    root = getattr(mesh, "_root_mesh", None) or mesh
    registry = getattr(root, "_pg_registry", None)
    if isinstance(registry, dict):
        for name in list(registry):
            registry[name] = dist.distributed_c10d._resolve_process_group(name)


def _same_name(group: dist.ProcessGroup) -> dist.ProcessGroup:
    return dist.distributed_c10d._resolve_process_group(group.group_name)
