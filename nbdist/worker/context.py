"""This engine's place in the run: rank, world size, device. Set once per group formation.

The one place on an engine that reads the rank layout (a ``protocol.RankInfo``, kept on
``state.engine``). It also writes the environment that torchrun would set, so that code written
for torchrun runs unchanged.
"""

from __future__ import annotations

import os

from ..errors import UsageError
from ..protocol import RankInfo
from .state import engine


def set_current(info: RankInfo) -> None:
    """Make ``info`` this engine's rank and export it to the environment, as torchrun does."""
    engine.rank_info = info
    os.environ.update(info.environ())


def current() -> RankInfo:
    """This engine's rank information; a clear error when called outside an nbdist engine."""
    if engine.rank_info is None:
        raise UsageError(
            "this runs on nbdist engines only: call it inside a %%distributed cell "
            "(start a cluster first with %nbdist start -n 2)"
        )
    return engine.rank_info


def rank() -> int:
    """This engine's global rank, 0..world_size-1 (stable: not ipyparallel's engine id)."""
    return current().rank


def world_size() -> int:
    """Number of ranks in the run."""
    return current().world_size


def local_rank() -> int:
    """This engine's rank among the engines on its host."""
    return current().local_rank


def is_main() -> bool:
    """True on rank 0, the rank that should print, save and report once for all."""
    return current().rank == 0


def device():
    """The ``torch.device`` this rank trains on: ``cuda:LOCAL_RANK`` with GPUs, else ``cpu``."""
    import torch

    return torch.device(current().device)
