"""This engine's place in the run: rank, world size, device. Set once per group formation.

The one place on an engine that knows the rank layout. It also writes the environment that
torchrun would set, so that code written for torchrun runs unchanged.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from ..errors import UsageError


@dataclass(frozen=True)
class RankInfo:
    """The torchrun-compatible description of one rank."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    group_rank: int  # index of this rank's host among the hosts
    master_addr: str
    master_port: int
    backend: str  # gloo | nccl
    device: str  # "cpu" or "cuda:<local_rank>"
    attempt: int = 0  # times the process group has been formed; names its store namespace

    def environ(self) -> dict[str, str]:
        """The variables torchrun sets for a worker, plus the agent-store switch."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.group_rank),
            "ROLE_RANK": str(self.rank),
            "ROLE_WORLD_SIZE": str(self.world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            # The store on MASTER_PORT is already served (by rank 0's engine, as torchrun's agent
            # serves it), so every rank connects as a client, under a fresh prefix per attempt.
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCHELASTIC_RESTART_COUNT": str(self.attempt),
        }

    def as_dict(self) -> dict:
        return asdict(self)


_current: RankInfo | None = None


def set_current(info: RankInfo) -> None:
    """Make ``info`` this engine's rank and export it to the environment, as torchrun does."""
    global _current
    _current = info
    os.environ.update(info.environ())


def current() -> RankInfo:
    """This engine's rank information; a clear error when called outside an nbdist engine."""
    if _current is None:
        raise UsageError(
            "this runs on nbdist engines only: call it inside a %%distributed cell "
            "(start a cluster first with %nbdist start -n 2)"
        )
    return _current


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
