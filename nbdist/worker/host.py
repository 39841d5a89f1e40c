"""How an engine sits on its host: each rank on its own share of the cores, and its C heap kept
from one step to the next.

**Cores**, as ``taskset`` or torchrun's ``--numa-binding`` would place a rank. A CPU-bound rank
whose threads the OS moves between cores loses its caches, and two ranks' threads on one core
take turns at every step. When a host's ranks fit its cores (the cores this engine was allowed
when it started: a ``taskset`` on the notebook holds), local rank ``i`` of ``k`` gets the ``i``-th
of ``k`` equal, contiguous shares; every thread it has and starts later (torch's intra-op pool,
data-loader workers) stays there. More ranks than cores, or ranks on GPUs (whose CPU threads
belong near their GPU, a NUMA question this does not answer), are left where the OS puts them.

**The heap**. A training step frees what the last one allocated (activations, gradients) and
allocates it again. glibc's malloc returns a freed block above its mmap threshold, and free
memory beyond its trim threshold at the top of the heap, to the OS, so every step faults those
pages back in and zeroes them: 650-1,750 page faults a step for the small CNN of
``benchmarks/workloads.py`` under torchrun. ``tune_heap`` raises both thresholds so a step reuses
the last one's memory, as a caching allocator would; ``release_heap`` hands what a finished cell
freed back to the OS, so an idle engine does not hold its peak. Only glibc is tuned (another C
library, macOS: nothing changes).
"""

from __future__ import annotations

import ctypes
import ctypes.util
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


#: mallopt's parameters (malloc.h) and the values given them.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD = 32 << 20  # glibc's largest: blocks up to 32 MiB come from the heap
_TRIM_THRESHOLD = 1 << 30  # up to 1 GiB free at the heap's top stays for the next step
_RELEASE_AFTER = 0.5  # seconds a cell ran before its end hands memory back

_libc: ctypes.CDLL | None = None


def tune_heap() -> bool:
    """Keep freed memory for reuse while cells run; True where this is glibc and it took."""
    global _libc
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
    except (OSError, TypeError):  # no C library found by name
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # not glibc: its mallopt means other things
        return False
    took = libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
    if not (took and libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)):
        return False
    _libc = libc
    return True


def release_heap(cell_seconds: float) -> None:
    """After a cell that ran ``cell_seconds``: give the memory freed by now back to the OS, so an
    idle engine keeps only what its variables hold. Skipped after a short cell (it freed little,
    and its round trip would pay); nothing where ``tune_heap`` did not take."""
    if _libc is not None and cell_seconds >= _RELEASE_AFTER:
        _libc.malloc_trim(0)
