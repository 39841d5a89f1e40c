"""Each rank on its own share of its host's cores, as ``taskset`` or torchrun's
``--numa-binding`` would place it.

A CPU-bound rank whose threads the OS moves between cores loses its caches, and two ranks'
threads on one core take turns at every step. When a host's ranks fit its cores (the cores this
engine was allowed when it started: a ``taskset`` on the notebook holds), local rank ``i`` of
``k`` gets the ``i``-th of ``k`` equal, contiguous shares; every thread it has and starts later
(torch's intra-op pool, data-loader workers) stays there. More ranks than cores, or ranks on
GPUs (whose CPU threads belong near their GPU, a NUMA question this does not answer), are left
where the OS puts them.
"""

from __future__ import annotations

import os

_allowed: tuple[int, ...] | None = None  # this engine's cores as it started, before pinning


def share(local_rank: int, local_world: int, allowed: tuple[int, ...]) -> tuple[int, ...]:
    """The cores of local rank ``local_rank`` of ``local_world`` among ``allowed``: its
    contiguous share, or all of them when the ranks do not fit."""
    each = len(allowed) // max(local_world, 1)
    if each < 1 or not 0 <= local_rank < local_world:
        return allowed
    return allowed[local_rank * each : (local_rank + 1) * each]


def pin(local_rank: int, local_world: int) -> tuple[int, ...] | None:
    """Put this engine's threads on its share of the cores; the cores, or None where the OS
    cannot pin (not Linux)."""
    global _allowed
    if not hasattr(os, "sched_setaffinity"):
        return None
    if _allowed is None:
        _allowed = tuple(sorted(os.sched_getaffinity(0)))
    mine = share(local_rank, local_world, _allowed)
    for tid in os.listdir("/proc/self/task"):  # the threads it has; new ones inherit the mask
        try:
            os.sched_setaffinity(int(tid), mine)
        except OSError:  # a thread that just ended
            pass
    return mine
