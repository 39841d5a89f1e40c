"""Engine sets: local, remote and hosted engines behind one interface (``base.EngineSet``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import EngineExit, EngineSet

if TYPE_CHECKING:
    from ...config import ClusterConfig

__all__ = ["EngineExit", "EngineSet", "for_config"]


def for_config(cfg: ClusterConfig) -> EngineSet:
    """The engine set a ``ClusterConfig`` asks for: remote hosts or schedulers, else local."""
    if cfg.remote is not None:
        from .remote import RemoteEngines

        return RemoteEngines(cfg)
    from .local import LocalEngines

    return LocalEngines(cfg)
