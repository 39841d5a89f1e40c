"""Training helpers for engines: put a model on this rank's device and make it data-parallel."""

from __future__ import annotations

from . import context


def prepare(model, optimizer=None, *, static_graph: bool = False, find_unused_parameters=False):
    """Move ``model`` to this rank's device and wrap it in DistributedDataParallel.

    Returns the wrapped model, or ``(model, optimizer)`` when an optimizer is given. DDP
    broadcasts rank 0's parameters, so every rank starts from the same weights. Gradient buckets
    are views of the gradients (no copy); ``static_graph=True`` lets DDP skip per-step checks
    when the model uses the same parameters every step.
    """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    info = context.current()
    if not dist.is_initialized():
        raise RuntimeError(
            "no process group on this rank: run this inside a %%distributed cell of a running "
            "cluster (a failed cell's group is re-formed at the start of the next one)"
        )
    device = torch.device(info.device)
    model = model.to(device)
    ddp = DistributedDataParallel(
        model,
        device_ids=[device] if device.type == "cuda" else None,
        gradient_as_bucket_view=True,
        static_graph=static_graph,
        find_unused_parameters=find_unused_parameters,
    )
    return ddp if optimizer is None else (ddp, optimizer)
