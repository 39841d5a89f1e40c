"""How many collectives this rank has entered in the running cell, and the one it is in now.

A cell whose ranks run different numbers of collectives (a loop that stops on the clock, data
of uneven length) ends on one rank while another waits, forever, in a collective the first will
never join. The notebook finds that out (``notebook.run.supervisor``) from the ranks that ended
and the one still waiting, and says which collective and how many each ran: counted here. The
collectives a cell calls through ``torch.distributed`` (``all_reduce``, ``broadcast``,
``barrier``, the object collectives...) are counted by wrapping torch's functions, and a DDP
model's gradient all-reduce by nbdist's own group on CPU (``group.LocalGroup``); a collective
torch calls from C++ (a DDP model on GPU, or on gloo with ``--no-shm``) is not counted, and the
notebook says the count is not known there.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist

from ..state import engine

#: The functions of ``torch.distributed`` counted (every rank of a group must call them alike).
COUNTED = (
    "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "barrier", "reduce", "gather",
    "scatter", "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
)  # fmt: skip


def begin_cell() -> None:
    """A cell begins: its count starts at 0."""
    engine.collective_calls = 0
    engine.in_collective = ""


@contextlib.contextmanager
def entered(name: str) -> Iterator[None]:
    """One collective, counted, named as the one this rank is in until it returns."""
    engine.collective_calls += 1
    outer, engine.in_collective = engine.in_collective, engine.in_collective or name
    try:
        yield
    finally:
        engine.in_collective = outer


def _counted(name: str, fn: Callable) -> Callable:
    @functools.wraps(fn)
    def counted(*args: Any, **kwargs: Any) -> Any:
        with entered(name):
            return fn(*args, **kwargs)

    counted.__nbdist_counted__ = True  # type: ignore[attr-defined]
    return counted


def install() -> None:
    """Count every call of ``COUNTED`` made through ``torch.distributed`` (once a process)."""
    for name in COUNTED:
        fn = getattr(dist, name, None)
        if fn is None or getattr(fn, "__nbdist_counted__", False):
            continue
        wrapped = _counted(name, fn)
        setattr(dist, name, wrapped)
        if getattr(dist.distributed_c10d, name, None) is fn:
            setattr(dist.distributed_c10d, name, wrapped)
