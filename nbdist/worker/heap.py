"""The engine's C heap, kept for the next step instead of handed back to the OS after each one.

A training step frees what the last one allocated (activations, gradients) and allocates it
again. glibc's malloc returns a freed block above its mmap threshold, and free memory beyond its
trim threshold at the top of the heap, to the OS, so every step faults those pages back in and
zeroes them: 600-1,300 page faults a step for the small CNN of ``benchmarks/workloads.py`` under
torchrun, about 5 % of its step time on two cores. ``tune`` raises both thresholds so a step
reuses the last one's memory, as a caching allocator would; ``release`` hands what a finished
cell freed back to the OS, so an idle engine does not hold its peak. Only glibc is tuned (Linux
with another C library, macOS: nothing changes).
"""

from __future__ import annotations

import ctypes
import ctypes.util

#: mallopt's parameters (malloc.h) and the values given them.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD = 32 << 20  # glibc's largest: blocks up to 32 MiB come from the heap
_TRIM_THRESHOLD = 1 << 30  # up to 1 GiB free at the heap's top stays for the next step
_RELEASE_AFTER = 0.5  # seconds a cell ran before its end hands memory back

_libc: ctypes.CDLL | None = None


def tune() -> bool:
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


def release(cell_seconds: float) -> None:
    """After a cell that ran ``cell_seconds``: give the memory freed by now back to the OS, so an
    idle engine keeps only what its variables hold. Skipped after a short cell (it freed little,
    and its round trip would pay); nothing where ``tune`` did not take."""
    if _libc is not None and cell_seconds >= _RELEASE_AFTER:
        _libc.malloc_trim(0)
