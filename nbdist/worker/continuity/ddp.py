"""A DDP model bound to a new formation of its group, in place: the person's ``model`` object
goes on training.

A stop (an interrupt, a rank's error, a lost rank) aborts the group a DDP model was made with,
and may leave its reducer half-way through a step (a backward whose buckets were never all
reduced: torch's reducer then refuses every later step). ``rebind`` gives the model the new
formation's group and a fresh reducer, as torch's own unpickling of a DDP model does
(``DistributedDataParallel.__setstate__``), re-registers its communication hooks with their
state bound to the new group (PowerSGD's restarts its warm-up: its buckets are made anew), and
drops the gradients a half-done step left. Its parameters, buffers and optimizer are the
person's own objects, untouched.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def rebind(ddp: DistributedDataParallel, group: dist.ProcessGroup) -> None:
    """Bind ``ddp`` to ``group`` (this formation's), with a fresh reducer and no gradients."""
    hooks = list(getattr(ddp, "_comm_hooks", ()))
    old = ddp.process_group
    ddp.process_group = group
    parameters, sparse = ddp._build_params_for_reducer()
    names = ddp._build_debug_param_to_name_mapping(parameters)
    ddp._ddp_init_helper(parameters, sparse, names, ddp.static_graph)
    if ddp.static_graph:
        ddp.reducer._set_static_graph()
        ddp.logger._set_static_graph()
    ddp._has_rebuilt_buckets = False
    ddp.require_backward_grad_sync = True  # a stop inside no_sync() left it off
    ddp.require_forward_param_sync = True
    ddp._comm_hooks = []
    for hook, state in hooks:
        ddp.register_comm_hook(_state(state, old, group), hook)
    for p in ddp.module.parameters():
        p.grad = None  # what a half-done step accumulated, or views of the old buckets


def _state(state: Any, old: dist.ProcessGroup, new: dist.ProcessGroup) -> Any:
    """A communication hook's state, bound to ``new`` where it held ``old``."""
    if isinstance(state, dist.ProcessGroup):
        return new if state is old else state
    if getattr(state, "process_group", None) is old:
        state.process_group = new
    for name in ("error_dict", "p_memory_dict", "q_memory_dict"):  # PowerSGD's, by bucket
        if isinstance(getattr(state, name, None), dict):
            getattr(state, name).clear()
    if hasattr(state, "iter") and hasattr(state, "start_powerSGD_iter"):
        state.iter = 0  # its plain warm-up again: the new reducer's buckets settle first
    return state
