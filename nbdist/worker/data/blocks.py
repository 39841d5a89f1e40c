"""``BlockLoader``: batches of files or a Hugging Face ``Dataset``, read on each rank by its own
loader workers, the same number on every rank, resumable mid-epoch exactly.

Which samples a rank and each of its workers read, in what order, is ``plan``'s arithmetic;
this module reads them (``sources``), makes batches (``columns``) and keeps the position: the
epoch, its domain, and how many batches this rank has handed out of it. ``state_dict()`` is
that position; ``_resume(saved)`` takes every rank's, so the next ``iter()`` continues where
the saved one stood (the same number of ranks), or re-splits the rest of the epoch over the
ranks there are now. An iterator chooses where it starts at its first ``next()``: one made before
``nbdist.restore`` (or ``nbdist.steps``) restored the loader still starts where it says.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch.utils.data as tud

from ...errors import UsageError
from ..reporting.datawait import timed
from . import columns, plan, workers

WINDOW = 65_536  # positions shuffled among themselves, unless shuffle_window= says


@dataclass(frozen=True)
class Settings:
    """What fixes the order of the batches: a saved position fits only the same settings."""

    batch_size: int
    shuffle: bool
    seed: int
    drop_last: bool
    window: int


class _Reader(tud.IterableDataset):
    """One epoch of one rank for torch's ``DataLoader``: each worker reads its runs of batches
    (``plan.runs``), blocks decoded once per worker and kept while its window needs them."""

    def __init__(
        self,
        source,
        epoch: plan.Epoch,
        part: list[plan.Span],
        runs: list,
        settings,
        transform: Callable | None,
    ) -> None:
        self.source, self.epoch, self.part, self.runs = source, epoch, part, runs
        self.settings, self.transform = settings, transform
        # rows of decoded blocks a worker keeps: a window's samples come from the blocks that
        # overlap it (two more at its edges); in order, from one block and the next
        self._keep = (settings.window if settings.shuffle else 0) + 2 * max(source.sizes)

    def __iter__(self) -> Iterator[Any]:
        info = tud.get_worker_info()
        mine = self.runs[info.id if info is not None else 0]
        cache: OrderedDict[int, Any] = OrderedDict()
        for run in mine:
            for j in range(run.start, run.stop):
                yield self._batch(j, cache)

    def __len__(self) -> int:  # torch asks; the DataLoader's length is the loader's own
        return sum(r.stop - r.start for runs in self.runs for r in runs)

    def _batch(self, j: int, cache: OrderedDict) -> Any:
        bs, rows = self.settings.batch_size, plan.length(self.part)
        where = plan.positions(plan.cut(self.part, j * bs, min((j + 1) * bs, rows)))
        blocks, offsets = self.epoch.samples(where)
        out: dict[str, Any] = {}
        for b in np.unique(blocks):
            mine = np.flatnonzero(blocks == b)
            for name, column in self._block(int(b), cache).items():
                _gather(out, name, column, mine, offsets[mine], len(where))
        return self.transform(out) if self.transform is not None else out

    def _block(self, b: int, cache: OrderedDict) -> dict[str, Any]:
        """Block ``b`` decoded once to a batch's columns (tensors, or lists for text), kept
        while the window needs it."""
        if b in cache:
            cache.move_to_end(b)
            return cache[b][1]
        block = columns.batch(self.source.read(b))
        cache[b] = (self.source.sizes[b], block)
        held = sum(n for n, _ in cache.values())
        while len(cache) > 1 and held > self._keep:
            held -= cache.popitem(last=False)[1][0]
        return block


def _gather(out: dict, name: str, column: Any, into: np.ndarray, rows: np.ndarray, n: int):
    """Put rows ``rows`` of a block's ``column`` at places ``into`` of the batch's column
    ``name`` (``n`` rows): tensors by one indexed copy; text, or a column that has no tensor
    form in some block, as a list of Python values, as collate leaves them."""
    import torch

    have = out.get(name)
    if isinstance(column, torch.Tensor) and (have is None or isinstance(have, torch.Tensor)):
        if have is None:
            have = out[name] = column.new_empty((n, *column.shape[1:]))
        have[torch.from_numpy(into)] = column[torch.from_numpy(rows)]
        return
    if isinstance(have, torch.Tensor):  # filled so far as a tensor: a list from here on
        have = out[name] = list(have)
    values = out.setdefault(name, [None] * n)
    taken = (
        list(column[torch.from_numpy(rows)])
        if isinstance(column, torch.Tensor)
        else [column[r] for r in rows.tolist()]
    )
    for i, v in zip(into.tolist(), taken, strict=True):
        values[i] = v


@dataclass(frozen=True)
class _Start:
    """Where the next epoch begins: its number, its domain, and the workers' runs."""

    epoch: int
    domain: list[plan.Span] | None  # None: every position
    done: int = 0  # batches already handed out of it
    workers: int = 0  # the workers that handed them out


class BlockLoader:
    """Batches of files or a ``Dataset`` for this rank: the same number on every rank, each
    rank and worker reading only its part (``plan``). ``iter()`` is one epoch; ``set_epoch``
    chooses the next one; ``state_dict`` is the position a checkpoint keeps."""

    def __init__(
        self,
        source,
        settings: Settings,
        rank: int,
        world: int,
        *,
        device=None,
        transform=None,
        options: dict | None = None,
    ) -> None:
        self.source, self.settings = source, settings
        self.rank, self.world = rank, world
        self._device, self._transform = device, transform
        self._options = dict(options or {})
        self.epoch = 0
        self._start: _Start | None = None  # given by _resume, taken by the next iterator
        self._reading: _Reading | None = None  # the epoch being handed out
        self._warned = False  # torch has given its advice on the number of workers
        workers.register(self)
        self._at = _Start(0, None)  # the live position: epoch, domain, handed out, workers

    # -- what people call ---------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` epoch number ``epoch`` (from its start)."""
        self.epoch, self._start = epoch, None
        self._at = _Start(epoch, None)

    def __len__(self) -> int:
        per = -(-sum(self.source.sizes) // self.world)
        return plan.batch_count(per, self.settings.batch_size, self.settings.drop_last)

    def __iter__(self) -> Iterator[Any]:
        return timed(self._epoch())  # each next() counted as the rank's wait for data

    def __repr__(self) -> str:
        s = self.settings
        return (
            f"<nbdist loader: {self.source.describe()}, {len(self)} batches of "
            f"{s.batch_size} per rank, epoch {self.epoch}>"
        )

    # -- the position ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """This rank's position: plain values, for a checkpoint."""
        at, n = self._at, self._batches(self._at.domain)
        if at.done >= n:  # an epoch handed out whole: the next one, from its start
            at = _Start(at.epoch + 1, None)
        return {
            "kind": "blocks",
            "fingerprint": self._fingerprint(),
            "world": self.world,
            "epoch": at.epoch,
            "domain": [list(s) for s in at.domain] if at.domain is not None else None,
            "done": at.done,
            "workers": at.workers,
        }

    def _resume(self, saved: list[dict]) -> None:
        """Continue from the position every rank saved (index: the rank that saved it)."""
        mine = next(s for s in saved if s)
        if mine.get("kind") != "blocks" or mine.get("fingerprint") != self._fingerprint():
            raise UsageError(
                "nbdist.restore: the checkpoint's loader read other data or in another order "
                "(files, batch_size, shuffle, seed, drop_last): restore with the loader it was "
                "saved with, or pass run= a new run"
            )
        domain = [tuple(s) for s in mine["domain"]] if mine["domain"] is not None else None
        if mine["world"] == self.world:
            mine = saved[self.rank] or mine  # in step, every rank's position is the same
            start = _Start(mine["epoch"], domain, mine["done"], mine["workers"])
        else:  # another number of ranks: the rest of the epoch, split over those there are now
            full = domain if domain is not None else [(0, sum(self.source.sizes))]
            s = self.settings
            rest = plan.remaining(
                full, mine["world"], mine["done"], s.batch_size, s.drop_last, mine["workers"]
            )
            start = _Start(mine["epoch"], rest or None) if rest else _Start(mine["epoch"] + 1, None)
        self.epoch, self._start, self._at = start.epoch, start, start

    # -- an epoch -----------------------------------------------------------------------------
    def _fingerprint(self) -> str:
        return f"{self.source.fingerprint()}:{self.settings}"

    def _batches(self, domain: list[plan.Span] | None) -> int:
        rows = plan.length(plan.rank_part(self._domain(domain), self.world, self.rank))
        return plan.batch_count(rows, self.settings.batch_size, self.settings.drop_last)

    def _domain(self, domain: list[plan.Span] | None) -> list[plan.Span]:
        return domain if domain is not None else [(0, sum(self.source.sizes))]

    def _epoch(self) -> Iterator[Any]:
        start = self._start or _Start(self.epoch, None)
        self._start = None
        self.epoch = start.epoch + 1
        self.reclaim()  # one epoch's workers at a time: an older iterator's go
        reading = self._reading = _Reading(self, start)
        self._at = reading.position()
        try:
            while (batch := reading.next()) is not None:
                self._at = reading.position()
                yield batch
        finally:
            reading.close()

    def reclaim(self) -> None:
        """End the worker processes of this loader's epoch in progress: its iterator, if asked
        for more, starts new ones where it stands (after a failed cell, a newer epoch)."""
        if self._reading is not None:
            self._reading.close()


class _Reading:
    """An epoch being handed out: torch's DataLoader over this rank's runs, made again from the
    batches handed out so far if its workers were reclaimed."""

    def __init__(self, loader: BlockLoader, start: _Start) -> None:
        self.loader, self.start = loader, start
        self.workers = max(int(loader._options.get("num_workers", 0) or 0), 1)
        self.n = loader._batches(start.domain)
        self.done = start.done
        self.batches: Iterator[Any] | None = None

    def position(self) -> _Start:
        return _Start(self.start.epoch, self.start.domain, self.done, self.workers)

    def next(self) -> Any:
        """The next batch, or None when the epoch has been handed out."""
        if self.done >= self.n:
            return None
        if self.batches is None:
            self.batches = self._open()
        try:
            batch = next(self.batches)
        except UsageError as e:  # from a worker, torch wraps it in the worker's traceback
            raise UsageError(
                str(e).rstrip().splitlines()[-1].split("UsageError: ", 1)[-1]
            ) from None
        self.done += 1
        device = self.loader._device
        return batch if device is None else columns.to_device(batch, device)

    def _open(self) -> Iterator[Any]:
        lo, s, start = self.loader, self.loader.settings, self.start
        begun = _Start(start.epoch, start.domain, self.done, start.workers or self.workers)
        part = plan.rank_part(lo._domain(start.domain), lo.world, lo.rank)
        order = plan.Epoch(lo.source.sizes, s.shuffle, s.seed, start.epoch, s.window)
        runs = _runs(self.n, self.workers, begun)
        reader = _Reader(lo.source, order, part, runs, s, lo._transform)
        options = {k: v for k, v in lo._options.items() if k != "persistent_workers"}
        with warnings.catch_warnings():
            if lo._warned:  # torch's advice on the number of workers: once per loader
                warnings.filterwarnings(
                    "ignore", message=".*worker processes", category=UserWarning
                )
            lo._warned = True
            return iter(tud.DataLoader(reader, batch_size=None, **options))

    def close(self) -> None:
        """Its workers end now (torch ends them at the iterator's ``__del__``, which a failed
        cell's traceback, kept for ``%nbdist debug``, would put off)."""
        if self.batches is not None:
            _stop_workers(self.batches)
            self.batches = None


def _stop_workers(batches: Any) -> None:
    """End a DataLoader iterator's worker processes (torch does at its ``__del__``, which an
    exception's traceback, kept by the engine, would put off)."""
    stop = getattr(batches, "_shutdown_workers", None)
    if stop is not None:
        stop()


def _runs(batches: int, workers: int, start: _Start) -> list[list[plan.Run]]:
    """Each worker's runs of batches for an epoch that had ``start.done`` handed out."""
    workers = max(workers, 1)
    if not start.done:
        return [[r] for r in plan.runs(batches, workers)]
    if start.workers == workers:
        return [[r] for r in plan.resume_runs(batches, workers, start.done)]
    # other workers than saved it: the batches left, in order, cut anew
    rest = plan.resume_runs(batches, start.workers, start.done)
    left = sorted((r for r in rest if r.stop > r.start), key=lambda r: r.start)
    flat = [j for r in left for j in range(r.start, r.stop)]
    each = -(-len(flat) // workers) if flat else 0
    return [[plan.Run(j, j + 1) for j in flat[w * each : (w + 1) * each]] for w in range(workers)]
