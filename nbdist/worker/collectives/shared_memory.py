"""All-reduce through shared memory, for the ranks of one group that share a host.

gloo all-reduces over TCP even between processes on one machine: every byte goes through the
kernel's socket buffers twice, on gloo's own threads, which on a workstation take turns with the
training thread on the same cores. For the MLP of ``benchmarks/workloads.py`` on 2 cores that is
8-10 ms of a 23 ms step. Here each rank copies its tensor into its slot of one mapped file, sums
its share of every slot into place, and copies the others' sums back: three passes over memory on
the calling thread, no system call, no other thread.

The segment: for each rank (a cache line each) how far it has come, beside what its call reduces
(its length, type and op: calls that differ fail, on every rank); one word that any rank sets to
stop the others at once (it failed, was interrupted, or was told to abort) beside the words that
say why; and two buffers of one slot per rank, used in turn, so a rank may start filling the
next buffer while slower ranks still read the last one. A call moves ``slot`` bytes a round;
bigger tensors take several rounds. Two waits (barriers) a round, each on every rank's record.

A rank's record of a barrier is one word: the barrier's number and the rank's call number, so
the ranks check at every barrier that they are in the same call, not only at the same count.
Each rank keeps its last two records (even and odd barriers): a peer that moved on to the next
barrier leaves its record of this one to be read. Anything that interrupts a rank mid-call
stops the group; and should that stop itself be cut short (a second interrupt), the rank's next
call publishes a call number its peers do not share: every rank fails, naming the ranks out of
step, rather than summing slots of different calls. The buffer a round uses follows from its
barrier's number, so no counter of the rank's own can drift from its peers'.

The sum runs in rank order (rank 0 + rank 1 + ...), the same on every rank: results are
deterministic, and at 2 ranks bit for bit gloo's (a + b is b + a in IEEE arithmetic). At 3 and
more ranks the last bit may differ from gloo's ring order.

Only x86-64 Linux uses it: the protocol needs a rank's copy to be seen before its counter moves,
which x86 guarantees for plain stores and weaker memory models (ARM) would need fences that
Python cannot issue. A waiting rank spins for a few microseconds, then yields its core for a few
milliseconds, then sleeps; with more ranks than cores it sleeps at once after its spin (a rank
that yields is soon run again, taking the core from the one it waits for). It checks every 50 ms
that the ranks it waits for are alive, so a dead peer fails the call within that, as a closed
socket fails gloo's.
"""

from __future__ import annotations

import mmap
import os
import platform
import sys
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist

_LINE = 64  # bytes: each rank's records on a cache line of their own
_WHY = 4 * _LINE  # bytes of the reason a stopped segment gives every rank
_SPIN = 50e-6  # seconds a waiting rank spins before it yields its core
_YIELD = 5e-3  # seconds it yields before it sleeps
_NAP = 200e-6  # seconds a sleeping waiter sleeps between looks...
#: ... and, once it has waited this long, a longer nap: a waiter that wakes every 200 µs takes the
#: interpreter's lock back before the engine's other threads (its telemetry, its stacks, its
#: kernel's output) can run, and they starve while it waits for a peer that may never come
_LONG_WAIT, _LONG_NAP = 0.05, 2e-3
_LOOK = 0.05  # seconds between checks that the ranks waited for are alive
_TAG = 1 << 16  # a record: its barrier's number times this, plus the call's number modulo it

_OPS = (
    (dist.ReduceOp.SUM, torch.add),
    (dist.ReduceOp.PRODUCT, torch.mul),
    (dist.ReduceOp.MIN, torch.minimum),
    (dist.ReduceOp.MAX, torch.maximum),
)
#: Element types summed here; others (bool, complex) go to gloo.
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_DTYPES += (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)
_OP_NAMES = {torch.add: "sum", torch.mul: "product", torch.minimum: "min", torch.maximum: "max"}
_FNS = tuple(_OP_NAMES)


class Aborted(RuntimeError):
    """A call on a segment that a rank stopped, or whose peer died: the group is over."""


def supported() -> bool:
    """True where this exchange is correct (x86-64 Linux)."""
    return platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64")


def segment_bytes(size: int, slot: int) -> int:
    """The bytes of a segment for ``size`` ranks with ``slot`` bytes each."""
    return _head(size) + 2 * size * slot


def _head(size: int) -> int:
    return _LINE * (size + 1) + _WHY


def reducer(tensor: torch.Tensor, op) -> Callable | None:
    """The elementwise function of ``all_reduce(tensor, op)`` through shared memory (``torch.add``
    for a sum), or None when it must go to gloo (another device, type or op)."""
    if tensor.device.type != "cpu" or tensor.dtype not in _DTYPES:
        return None
    return next((fn for kind, fn in _OPS if op == kind), None)  # a ReduceOp equals its kind


class Exchange:
    """One rank's view of a segment: ``fd`` is the open file every rank of the group mapped,
    ``pids`` the process of each rank (to tell a dead peer from a slow one)."""

    def __init__(self, fd: int, rank: int, size: int, slot: int, pids: list[int], timeout: float):
        self.rank, self.size, self.timeout = rank, size, timeout
        self._pids = pids
        self._map = mmap.mmap(fd, segment_bytes(size, slot))
        words = _LINE // 8
        lines = np.frombuffer(self._map, np.int64, words * (size + 1)).reshape(size + 1, -1)
        self._records = (lines[:size, 0], lines[:size, 1])  # every rank's, of its last even, odd
        self._calls = lines[:size, 2:4]  # rank k's call: its length, and its type and op
        self._words = memoryview(self._map)[: _LINE * (size + 1)].cast("q")  # one word at a time
        self._mine = rank * words  # where this rank's even record is (its odd one: after it)
        self._stop = size * words  # where the word is: 0, or 1 + the rank that stopped the group
        self._why_at = _LINE * (size + 1)
        data = torch.frombuffer(self._map, dtype=torch.uint8)[_head(size) :]
        self._slots = data.view(2, size, slot)
        self._typed: dict[torch.dtype, torch.Tensor] = {}
        self._yield = _YIELD if size <= (os.cpu_count() or 1) else 0.0
        self._seq = 0  # barriers published; every rank reaches the same ones in the same order
        self._call = 0  # calls begun

    def allreduce(self, tensor: torch.Tensor, fn: Callable = torch.add) -> None:
        """Reduce ``tensor`` across the group in place, with ``fn`` (from ``reducer``)."""
        flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
        buffers = self._typed.get(tensor.dtype)
        if buffers is None:
            buffers = self._typed[tensor.dtype] = self._slots.view(tensor.dtype)
        per = buffers.shape[-1]
        self._call += 1
        self._words[self._mine + 2] = flat.numel()
        self._words[self._mine + 3] = _DTYPES.index(tensor.dtype) * 8 + _FNS.index(fn)
        try:
            for start in range(0, max(flat.numel(), 1), per):  # an empty call is checked too
                self._round(buffers, flat[start : start + per], fn, start == 0)
        except BaseException as e:  # anywhere in a round (an interrupt between two copies):
            if not isinstance(e, Aborted):  # its peers' rounds would read the wrong buffer,
                self.abort(f"{type(e).__name__} on rank {self.rank}")  # so they stop too
            raise
        if flat.data_ptr() != tensor.data_ptr():
            tensor.copy_(flat.view_as(tensor))

    def _round(self, buffers: torch.Tensor, part: torch.Tensor, fn, first: bool) -> None:
        n, r, length = self.size, self.rank, part.numel()
        cut = [length * k // n for k in range(n + 1)]  # rank k sums [cut[k], cut[k + 1])
        slots = buffers[(self._seq + 1) >> 1 & 1]  # by the round's first barrier: in turn
        slots[r, :length].copy_(part)
        self._arrive()
        if first and self._calls.tobytes() != self._calls[r].tobytes() * n:
            self._differ()
        lo, hi = cut[r], cut[r + 1]
        mine = part[lo:hi]
        fn(slots[0, lo:hi], slots[1, lo:hi], out=mine)
        for k in range(2, n):
            fn(mine, slots[k, lo:hi], out=mine)
        slots[r, lo:hi].copy_(mine)
        self._arrive()
        for k in range(n):
            if k != r:
                part[cut[k] : cut[k + 1]].copy_(slots[k, cut[k] : cut[k + 1]])

    def _arrive(self) -> None:
        """Say this rank got here, in this call; return when every rank has, in the same call."""
        seq = self._seq + 1
        word = seq * _TAG + self._call % _TAG
        if self._words[self._stop]:
            raise self._aborted()
        # published, then counted: a rank cut short in between publishes this barrier again,
        # in its next call, and its peers see a call that is not theirs
        self._words[self._mine + (seq & 1)] = word
        self._seq = seq
        if self._records[seq & 1].tobytes() != word.to_bytes(8, sys.byteorder) * self.size:
            self._wait()

    def _wait(self) -> None:
        """Wait for every rank's record of this barrier, then check they are of one call."""
        records = self._records[self._seq & 1]
        first = self._seq * _TAG  # this barrier's lowest record: below it, a rank to come
        t0 = time.monotonic()
        spin_until, yield_until = t0 + _SPIN, t0 + self._yield
        look, deadline = t0 + _LOOK, t0 + self.timeout
        while records.min() < first:
            if self._words[self._stop]:
                raise self._aborted()
            now = time.monotonic()
            if now < spin_until:
                continue
            if now >= look:
                self._look(records, first)
                look = now + _LOOK
                if now >= deadline:
                    late = [k for k in range(self.size) if records[k] < first]
                    self.abort(f"rank {self.rank} waited {self.timeout:.0f} s for ranks {late}")
                    raise self._aborted()
            if now < yield_until:
                os.sched_yield()
            else:
                time.sleep(_NAP if now - t0 < _LONG_WAIT else _LONG_NAP)
        got, word = records.tolist(), first + self._call % _TAG
        if got != [word] * self.size:
            self._out_of_step(got, word)

    def _out_of_step(self, got: list[int], word: int) -> None:
        """Fail a barrier the ranks reached in different calls (a rank left one part-way,
        without stopping the group, and called again): their slots hold different calls'."""
        half = _TAG // 2
        parts = [
            f"rank {k} in call {self._call + (g - word + half) % _TAG - half}"
            for k, g in enumerate(got)
            if g != word or k == self.rank
        ]
        self.abort(
            f"ranks out of step: {', '.join(parts)} (a rank left an all-reduce part-way, "
            "interrupted, and called again)"
        )
        raise self._aborted()

    def _differ(self) -> None:
        """Fail a call that is not every rank's: a sum of different things is no sum."""
        calls = [f"rank {k}: {n} x {_DTYPES[c // 8]} {_OP_NAMES[_FNS[c % 8]]}"
                 for k, (n, c) in enumerate(self._calls.tolist())]  # fmt: skip
        why = (
            f"all-reduce calls differ across ranks ({'; '.join(calls)}): every rank must "
            "all-reduce the same length, type and op, in the same order"
        )
        self.abort(why)
        raise RuntimeError(why)

    def _look(self, records: np.ndarray, first: int) -> None:
        """Abort when a rank not yet arrived has exited."""
        for k in range(self.size):
            if records[k] < first and not _alive(self._pids[k]):
                self.abort(f"rank {k} (pid {self._pids[k]}) exited during an all-reduce")
                raise self._aborted()

    def abort(self, why: str) -> None:
        """Stop every rank's calls on this segment, now and from now on; each says ``why``."""
        if not self._words[self._stop]:
            text = why.encode()[: _WHY - 1].ljust(_WHY, b"\0")
            self._map[self._why_at : self._why_at + _WHY] = text  # seen before the stop word
            self._words[self._stop] = 1 + self.rank

    def _aborted(self) -> Aborted:
        why = self._map[self._why_at : self._why_at + _WHY].rstrip(b"\0").decode(errors="replace")
        who = f"rank {self._words[self._stop] - 1} stopped the group"
        return Aborted(f"all-reduce through shared memory stopped: {why or who}")


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie has exited: only its parent has not reaped it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")
