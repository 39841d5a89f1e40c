"""Engines on other hosts, started over SSH or through a scheduler by ipyparallel's launchers.

``engines.RemoteEngines`` is the engine set (``EngineSet``); ``launchers`` holds ipyparallel's
launchers as nbdist uses them (``ssh``, ``slurm``, ``mpi``, ``local``) and checks their options;
``checks`` runs before and just after the engines start (the controller's address, each host
over ssh, threads per engine, one environment across hosts); ``shell`` runs scripts on a host;
``slurm`` asks Slurm (the check before submitting, a job's state, cancelling); ``jobs`` keeps a
scheduler's jobs (queued, ended, cancelled by a guard when the kernel is gone).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .engines import RemoteEngines
    from .jobs import RemoteExit
    from .launchers import launcher_options

__all__ = ["RemoteEngines", "RemoteExit", "launcher_options"]
_WHERE = {"RemoteEngines": "engines", "RemoteExit": "jobs", "launcher_options": "launchers"}


def __getattr__(name: str) -> object:
    """Imported when first asked for: ``slurm`` alone (the server's) loads no ipyparallel."""
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
