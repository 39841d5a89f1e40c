"""A stream's part for each rank and each of its loader workers, and its position there.

A torch ``IterableDataset`` is split by position: sample ``i`` goes to rank ``i % world`` and,
there, to worker ``(i // world) % num_workers`` (``owner``); every worker reads the stream whole
and keeps its part. A Hugging Face stream splits itself (``split_dataset_by_node``, then by files
over the workers). ``SplitStream`` is what each worker iterates: its part, in order or shuffled by
windows of consecutive samples, and its position as ``state_dict()``: the stream's own state (or,
for a stream with only a length, how many samples it read: it is replayed) at the window's
start, and how many of the window it handed out. Torchdata's ``StatefulDataLoader`` asks it in
each worker after each batch and gives it back on resume.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.utils.data as tud

#: Samples per shuffle window of a worker (held in its memory), as Hugging Face's buffer.
SHUFFLE_WINDOW = 1000
_FRESH = {"read": 0, "source": None, "window": 0, "taken": 0}


# -- the rules, pure ------------------------------------------------------------------------------
def owner(position: int, world: int, workers: int) -> tuple[int, int]:
    """The rank and worker that read sample ``position`` of a torch stream."""
    return position % world, (position // world) % workers


def part_sizes(n: int, world: int, workers: int) -> list[list[int]]:
    """Samples of an ``n``-sample stream per rank, per worker: ``[rank][worker]``."""
    ranks = [len(range(r, n, world)) for r in range(world)]
    return [[len(range(w, size, workers)) for w in range(workers)] for size in ranks]


def epoch_batches(n: int, world: int, workers: int, batch_size: int, drop_last: bool) -> int:
    """Batches every rank yields in an epoch of an ``n``-sample stream: the fewest of any rank,
    each worker batching its own samples (its last batch short, or dropped)."""

    def batches(size: int) -> int:
        return size // batch_size if drop_last else -(-size // batch_size)

    return min(sum(batches(s) for s in rank) for rank in part_sizes(n, world, workers))


def window_order(size: int, seed: int, epoch: int, rank: int, worker: int, window: int):
    """The order in which a worker hands out the ``size`` samples of one shuffle window."""
    key = (seed % (1 << 64), epoch, rank, worker, window)
    return np.random.default_rng(key).permutation(size)


def file_epoch(seed: int, epoch: int) -> int:
    """The epoch given to a shuffled Hugging Face stream, whose file order follows it: from seed
    and epoch, the same on every rank (never 0, the epoch it leaves in order)."""
    return int(np.random.default_rng((seed % (1 << 64), epoch)).integers(1, 1 << 62))


# -- a worker's part of the stream ----------------------------------------------------------------
class SplitStream(tud.IterableDataset):
    """This worker's part of ``source``, in order or by shuffled windows, with its position as
    ``state_dict()`` (torchdata asks it in the worker after each batch, and gives it back).

    ``splits``: nbdist keeps the samples by position (a torch stream); else the source splits
    itself (a Hugging Face stream). ``stateful``: the source has ``state_dict`` and
    ``load_state_dict``; else it is replayed up to the position.
    """

    def __init__(
        self,
        source,
        *,
        rank: int,
        world: int,
        splits: bool,
        stateful: bool,
        shuffle: bool,
        seed: int,
        window: int = SHUFFLE_WINDOW,
    ):
        self.source, self.rank, self.world = source, rank, world
        self.splits, self.stateful = splits, stateful
        self.shuffle, self.seed, self.window = shuffle, seed, window
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()  # persistent workers
        self._start: dict | None = None  # given back by torchdata, taken by the next iter()
        self._at = (0, None, 0)  # the window's start: samples read, the source's state, window
        self._read = self._taken = 0  # samples read of the stream; handed out of the window
        self._live = False  # unshuffled, past the start: the position is the source's own

    def set_epoch(self, epoch: int) -> None:
        self._epoch.fill_(epoch)
        if self.shuffle and not self.splits:  # a Hugging Face stream: its order of files
            self.source.set_epoch(file_epoch(self.seed, epoch))

    def state_dict(self) -> dict:
        epoch = int(self._epoch)
        if self._live:
            source = self.source.state_dict() if self.stateful else None
            return {"epoch": epoch, "read": self._read, "source": source, "window": 0, "taken": 0}
        read, source, window = self._at
        return {
            "epoch": epoch,
            "read": read,
            "source": source,
            "window": window,
            "taken": self._taken,
        }

    def load_state_dict(self, state: dict) -> None:
        self._start = dict(state)
        self._at = (state["read"], state["source"], state["window"])
        self._read, self._taken, self._live = state["read"], state["taken"], False

    def __iter__(self) -> Iterator[Any]:
        info = tud.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch = int(self._epoch)
        start, self._start = self._start, None
        if start is None or start["epoch"] != epoch:
            start = _FRESH
        self._at = (start["read"], start["source"], start["window"])
        self._read, self._taken, self._live = start["read"], start["taken"], False
        owned = self._owned(start, worker, workers)
        if not self.shuffle:
            return self._in_order(owned)
        return self._windows(owned, start, epoch, worker)

    def _owned(self, start: dict, worker: int, workers: int) -> Iterator[Any]:
        if self.stateful and (start["source"] is not None or not self.splits):
            # None: from the epoch's start; a Hugging Face stream (it splits itself) so forgets a
            # start given before, which would else begin the next epoch of its number there
            self.source.load_state_dict(start["source"])
        it = iter(self.source)
        read = start["read"]
        if start["source"] is None and read:  # a stream without state: replayed
            collections.deque(itertools.islice(it, read), maxlen=0)
        # positions read, read + period, ...: rank r's worker w's (with period 1: every one)
        period = self.world * workers if self.splits else 1
        first = (self.rank + self.world * worker - read) % period if self.splits else 0
        positions = itertools.count(read + first, period)
        for position, sample in zip(
            positions, itertools.islice(it, first, None, period), strict=False
        ):
            self._read = position + 1
            yield sample

    def _in_order(self, owned: Iterator[Any]) -> Iterator[Any]:
        for sample in owned:
            self._live = True
            yield sample

    def _windows(self, owned, start: dict, epoch: int, worker: int) -> Iterator[Any]:
        window, skip = start["window"], start["taken"]
        while True:
            samples = list(itertools.islice(owned, self.window))
            if not samples:
                return
            order = window_order(len(samples), self.seed, epoch, self.rank, worker, window)
            for taken, i in enumerate(order.tolist()[skip:], skip + 1):
                self._taken = taken
                yield samples[i]
            window, skip, self._taken = window + 1, 0, 0
            source = self.source.state_dict() if self.stateful else None
            self._at = (self._read, source, window)
