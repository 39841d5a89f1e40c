"""How an engine sits on its host: each rank on its own share of the cores, its C heap kept
from one step to the next, and its idle threads asleep between cells.

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

**Idle**. gloo's TCP transport has one thread per process whose ``epoll_wait`` times out every
10 ms, busy or not: 100 wake-ups a second, about 0.2 % of a core per idle engine, most of an idle
cluster's cost (0.15-0.25 % per engine measured, the controller included). Its timeout only
paces waits for a "tick" of that thread (a connection closed, a group destroyed); data wakes it
at once. Between cells (``idle``), its timer slack is raised to ``_IDLE_SLACK``, so the kernel
lets the timeout run that much late (under 2 wake-ups a second, not 100); as a cell starts or a
group forms (``busy``), it is the default again. A group's end waits for that thread's ticks:
with the slack left on, ending a 4-rank group took 1 s, not 0.03 s; set back first, it takes
0.02-0.05 s after an idle spell (its peers' traffic wakes the thread at once, measured). Linux
lets a process set another thread's slack only with CAP_SYS_NICE; without it nothing changes.
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


_IDLE_SLACK = 500_000_000  # ns an idle gloo loop's 10 ms timeout may run late
_LOOP_THREAD = "gloo_tcp_loop"  # the thread's name (its comm)
_loop: str | None = None  # the loop thread's id as last found (one per process, if any)


def idle() -> None:
    """Between cells: let gloo's loop thread sleep (see the module's text)."""
    global _loop
    if not _is_loop(_loop):
        _loop = next((t for t in _threads() if _is_loop(t)), None)
    _slack(_loop, _IDLE_SLACK)


def busy() -> None:
    """A cell or a group formation starts: gloo's loop thread ticks every 10 ms again (a new
    one, started meanwhile, has the default already)."""
    if _is_loop(_loop):
        _slack(_loop, 0)  # 0: the thread's default slack


def _slack(tid: str | None, ns: int) -> None:
    if tid is None:
        return
    try:
        with open(f"/proc/{tid}/timerslack_ns", "w") as f:
            f.write(str(ns))
    except OSError:  # no CAP_SYS_NICE, or the thread just ended: its 10 ms ticks stay
        pass


def _is_loop(tid: str | None) -> bool:
    if tid is None:
        return False
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip() == _LOOP_THREAD
    except OSError:  # ended, or not Linux
        return False


def _threads() -> list[str]:
    try:
        return os.listdir("/proc/self/task")
    except OSError:  # not Linux
        return []
