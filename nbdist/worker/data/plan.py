"""Which samples each rank and each of its loader workers read in an epoch, and in what order:
pure arithmetic over the data's blocks, the same on every rank and every host.

The data is a list of blocks (a Parquet row group, a stretch of JSON lines, a slice of an Arrow
table), each of a known number of rows. An epoch puts every sample at one *position* of a
sequence that does not depend on the number of ranks: the blocks in an order shuffled from
``(seed, epoch)``, their rows in order, and then the samples of each ``window`` consecutive
positions shuffled among themselves (from ``(seed, epoch, window)``), so a batch mixes blocks
while a reader holds no more than a window's blocks at once. Nothing here holds an array as long
as the data: a rank's memory does not grow with the dataset.

**Ranks.** The epoch's positions (its *domain*: all of them, or those left after a resume over
another number of ranks) are cut into ``world`` contiguous parts of ``ceil(n / world)``; the
last part is made up to that length with the domain's first positions again, as torch's
``DistributedSampler`` pads, so every rank has the same number of samples and of batches. Each
rank then cuts its part into batches (the last one short, or dropped with ``drop_last``).

**Workers.** A rank's batches go to its loader workers in contiguous runs of ``ceil(batches /
workers)``, so each worker reads its own blocks; torch's ``DataLoader`` hands them out round
robin (worker 0's first, worker 1's first, ..., worker 0's second, ...; a worker whose run ended
drops out of the turn). ``Position`` is how many batches a rank had handed out: from it,
``resume_runs`` gives each worker the rest of its run, the workers rotated so the next batch
handed out is the one an uninterrupted epoch would have handed out next.

**Another number of ranks.** ``remaining`` is the domain without what every old rank had
handed out, and is split over the new ranks as above: no sample is read twice or skipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

Span = tuple[int, int]  # positions [start, end) of an epoch's sequence


@dataclass(frozen=True)
class Epoch:
    """One epoch's order of the samples: the blocks' order and the windows' shuffles."""

    sizes: tuple[int, ...]  # rows of each block, in the data's order
    shuffle: bool
    seed: int
    epoch: int
    window: int  # positions shuffled among themselves (with ``shuffle``)

    @property
    def total(self) -> int:
        return sum(self.sizes)

    @cached_property
    def blocks(self) -> np.ndarray:
        """The blocks in this epoch's order."""
        n = len(self.sizes)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng((self.seed, self.epoch)).permutation(n)

    @cached_property
    def _starts(self) -> np.ndarray:
        """The position at which each block (in this epoch's order) begins."""
        ordered = np.asarray(self.sizes, dtype=np.int64)[self.blocks]
        return np.concatenate([[0], np.cumsum(ordered)])

    def samples(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The (block, row in block) of the samples at ``positions`` of this epoch."""
        source = self._shuffled(np.asarray(positions, dtype=np.int64))
        at = np.searchsorted(self._starts, source, side="right") - 1
        return self.blocks[at], source - self._starts[at]

    def _shuffled(self, positions: np.ndarray) -> np.ndarray:
        """Where each position's sample stands before its window was shuffled."""
        if not self.shuffle or len(positions) == 0:
            return positions
        out = np.empty_like(positions)
        windows = positions // self.window
        for w in np.unique(windows):
            start = int(w) * self.window
            size = min(self.window, self.total - start)
            perm = _window(self.seed, self.epoch, int(w), size)
            mine = windows == w
            out[mine] = start + perm[positions[mine] - start]
        return out


@lru_cache(maxsize=4)
def _window(seed: int, epoch: int, window: int, size: int) -> np.ndarray:
    """One window's shuffle: drawn once per window and worker, not once per batch."""
    return np.random.default_rng((seed, epoch, window)).permutation(size)


# -- spans: a domain of positions, and parts of it -------------------------------------------------
def length(spans: list[Span]) -> int:
    return sum(b - a for a, b in spans)


def cut(spans: list[Span], start: int, stop: int) -> list[Span]:
    """Positions ``start`` to ``stop`` of the sequence the spans make, as spans; past the end the
    sequence begins again (the padding)."""
    n = length(spans)
    out: list[Span] = []
    while start < stop:
        base = (start // n) * n
        lo, hi = start - base, min(stop - base, n)
        at = 0
        for a, b in spans:
            s0, s1 = max(lo, at), min(hi, at + b - a)
            if s0 < s1:
                out.append((a + s0 - at, a + s1 - at))
            at += b - a
        start = base + hi
    return out


def positions(spans: list[Span]) -> np.ndarray:
    return np.concatenate([np.arange(a, b) for a, b in spans] or [np.zeros(0, np.int64)])


def rank_part(domain: list[Span], world: int, rank: int) -> list[Span]:
    """Rank ``rank``'s contiguous part of the domain, padded to the same length on every rank."""
    per = math.ceil(length(domain) / world)
    return cut(domain, rank * per, (rank + 1) * per)


def batch_count(rows: int, batch_size: int, drop_last: bool) -> int:
    return rows // batch_size if drop_last else math.ceil(rows / batch_size)


def remaining(
    domain: list[Span], world: int, done: int, batch_size: int, drop_last: bool, workers: int
) -> list[Span]:
    """The domain without what each of ``world`` ranks had handed out (``done`` batches each,
    from ``workers`` workers' runs), for a resume over another number of ranks."""
    taken: list[Span] = []
    for r in range(world):
        part = rank_part(domain, world, r)
        rows = length(part)
        old = runs(batch_count(rows, batch_size, drop_last), max(workers, 1))
        counts, _ = handed_out([x.stop - x.start for x in old], done)
        for run, n in zip(old, counts, strict=True):
            stop = min((run.start + n) * batch_size, rows)
            taken += cut(part, run.start * batch_size, stop)
    out = []
    for a, b in domain:
        for x, y in sorted(taken):
            if y <= a or x >= b:
                continue
            if x > a:
                out.append((a, x))
            a = max(a, y)
            if a >= b:
                break
        if a < b:
            out.append((a, b))
    return out


# -- workers --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    """Batches ``start`` to ``stop`` of a rank's epoch: what one loader worker reads, in order."""

    start: int
    stop: int


def runs(batches: int, workers: int) -> list[Run]:
    """A rank's batches in contiguous runs, one per worker (later ones shorter or empty)."""
    each = math.ceil(batches / max(workers, 1)) if batches else 0
    return [Run(min(w * each, batches), min((w + 1) * each, batches)) for w in range(workers)]


def handed_out(lengths: list[int], count: int) -> tuple[list[int], int]:
    """After ``count`` batches were handed out round robin from runs of ``lengths``: how many of
    each run were, and whose turn is next (the first with a batch left, in the cycle)."""
    t, left = 0, count  # t: whole turns taken
    while left:
        active = [w for w, n in enumerate(lengths) if n > t]
        if not active:
            break
        whole = min(min(lengths[w] for w in active) - t, left // len(active))
        if not whole:  # a turn part-way: the first ``left`` workers of it had theirs
            done = [min(n, t) for n in lengths]
            for w in active[:left]:
                done[w] += 1
            return done, active[left]
        t, left = t + whole, left - whole * len(active)
    done = [min(n, t) for n in lengths]
    return done, next((w for w, n in enumerate(lengths) if done[w] < n), 0)


def resume_runs(batches: int, workers: int, count: int) -> list[Run]:
    """The runs of a rank's epoch after ``count`` batches were handed out, rotated so that a
    new ``DataLoader`` (which starts its turn at worker 0) hands out next what the old would."""
    old = runs(batches, workers)
    done, turn = handed_out([r.stop - r.start for r in old], count)
    rest = [Run(r.start + d, r.stop) for r, d in zip(old, done, strict=True)]
    return rest[turn:] + rest[:turn]


def handed_out_order(lengths: list[int]) -> list[tuple[int, int]]:
    """(worker, index in its run) in the order the batches are handed out: for tests and for
    mapping a count to batches."""
    out, t = [], 0
    while any(t < n for n in lengths):
        out += [(w, t) for w, n in enumerate(lengths) if t < n]
        t += 1
    return out
