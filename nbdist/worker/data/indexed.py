"""Loaders over data addressed by index: a variable ``nbdist.scatter`` sent (each rank holds
its shard) and a map-style torch ``Dataset`` (every rank can read every index).

Every rank gets the same number of batches per epoch, even when shards differ in size: each
rank's epoch order is padded cyclically, with its own samples, to the largest shard (a Dataset:
``DistributedSampler``'s rule). A DDP step is a collective, so one extra batch on one rank would
hang the others at the end of the epoch.

A loader's position (the epoch, and the batches handed out of it) is what ``loader=`` saves in a
checkpoint. Resumed over the same number of ranks, the epoch continues with the next batch; a
Dataset's epoch resumed over another number continues with what no rank had, split over the
ranks there are now (the ranks had handed out the same number of batches, so what was read is
the head of the epoch's permutation); a scattered variable, re-scattered over other ranks,
starts its epoch again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ... import wire
from ...errors import UsageError
from .. import context
from ..reporting.datawait import timed
from ..state import engine, namespace
from .columns import to_device


# -- the sampling plan of one epoch: pure functions -----------------------------------------------
def batch_count(rows: int, batch_size: int, drop_last: bool) -> int:
    """Batches in an epoch of ``rows`` samples."""
    return rows // batch_size if drop_last else math.ceil(rows / batch_size)


def epoch_order(size: int, target: int, *, shuffle: bool, seed: int, epoch: int, rank: int):
    """This rank's sample order for one epoch: its ``size`` rows (shuffled from seed, epoch and
    rank), repeated cyclically up to ``target`` rows so that every rank has as many."""
    if shuffle:
        order = np.random.default_rng((seed, epoch, rank)).permutation(size)
    else:
        order = np.arange(size)
    return np.resize(order, target)


def dataset_order(n: int, world: int, rank: int, *, shuffle: bool, seed: int, epoch: int):
    """``DistributedSampler``'s rule: one permutation of all ``n`` indices, the same on every
    rank, padded cyclically to a multiple of ``world``; rank r takes every world-th from r."""
    order = np.random.default_rng((seed, epoch)).permutation(n) if shuffle else np.arange(n)
    return np.resize(order, math.ceil(n / world) * world)[rank::world]


def split_batches(order: np.ndarray, batch_size: int, drop_last: bool) -> list[np.ndarray]:
    """Cut an epoch's order into batches (the last one short, or dropped with ``drop_last``)."""
    n = batch_count(len(order), batch_size, drop_last)
    return [order[i * batch_size : (i + 1) * batch_size] for i in range(n)]


# -- the loader -----------------------------------------------------------------------------------
class _Batches:
    """A torch ``batch_sampler`` whose batches the loader sets before each epoch."""

    def __init__(self, batches: list[np.ndarray]):
        self.batches = batches

    def __iter__(self):
        return (b.tolist() for b in self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class ShardLoader:
    """Batches of this rank's data: the same number on every rank, reshuffled each epoch.

    Each ``iter()`` is one epoch; the epoch number (0, 1, ...) seeds the shuffle, so runs are
    reproducible. ``set_epoch(e)`` chooses the next epoch, as with ``DistributedSampler``;
    ``state_dict`` is the position ``loader=`` keeps in a checkpoint.
    """

    def __init__(
        self,
        order_of,
        rows: int,
        batch_size: int,
        drop_last: bool,
        fetch=None,
        dataloader=None,
        device=None,
        *,
        world: int = 1,
        fingerprint: str = "",
        resplit: Callable[[int, int, int], np.ndarray] | None = None,
    ):
        self._order_of = order_of  # epoch -> this rank's order (the same length on every rank)
        self._rows = rows
        self.batch_size = batch_size
        self.drop_last = drop_last
        self._fetch = fetch  # indices -> batch, for scattered shards
        self._dataloader = dataloader  # torch DataLoader over a Dataset, batch_sampler _Batches
        self._device = device  # where the Dataset's batches go (scattered shards: in fetch)
        self.epoch = 0
        self._world, self._fingerprint = world, fingerprint
        # (old world, epoch, samples each rank had) -> this rank's rest of that epoch
        self._resplit = resplit
        self._start: tuple | None = None  # (epoch, batches done, order or None): from _resume
        self._at: tuple = (0, 0, math.inf)  # (epoch, batches handed out, batches in it)

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` epoch number ``epoch`` (from its start)."""
        self.epoch, self._start, self._at = epoch, None, (epoch, 0, math.inf)

    def __len__(self) -> int:
        return batch_count(self._rows, self.batch_size, self.drop_last)

    def __iter__(self) -> Iterator[Any]:
        """One epoch's batches, each ``next()`` timed as the rank's wait for data. Where it
        starts is chosen at the first ``next()``: after a ``restore`` that came between."""
        return timed(self._epoch())

    def _epoch(self) -> Iterator[Any]:
        epoch, done, order = self._start or (self.epoch, 0, None)
        self._start, self.epoch = None, epoch + 1
        order = self._order_of(epoch) if order is None else order
        batches = split_batches(order, self.batch_size, self.drop_last)
        self._at = (epoch, done, len(batches))
        if self._dataloader is None:
            out = (self._fetch(b) for b in batches[done:])
        else:
            self._dataloader.batch_sampler.batches = batches[done:]
            out = iter(self._dataloader)
            if self._device is not None:
                out = (to_device(b, self._device) for b in out)
        for handed, batch in enumerate(out, done + 1):
            self._at = (epoch, handed, len(batches))
            yield batch

    # -- the position a checkpoint keeps (``loader=``) ----------------------------------------
    def state_dict(self) -> dict:
        """This rank's position: the epoch, and the batches handed out of it."""
        epoch, done, n = self._at
        if done >= n:  # an epoch handed out whole: the next one, from its start
            epoch, done = epoch + 1, 0
        return {
            "kind": "indexed",
            "fingerprint": self._fingerprint,
            "world": self._world,
            "epoch": epoch,
            "done": done,
        }

    def _resume(self, saved: list[dict | None]) -> None:
        """Continue from the position the ranks saved (index: the rank that saved it)."""
        mine = next(s for s in saved if s)
        if mine.get("kind") != "indexed" or mine.get("fingerprint") != self._fingerprint:
            raise UsageError(
                "nbdist.restore: the checkpoint's loader read other data or in another order "
                "(data, batch_size, shuffle, seed, drop_last): restore with the loader it was "
                "saved with, or pass run= a new run"
            )
        epoch, done = mine["epoch"], mine["done"]
        if mine["world"] == self._world:
            self._start = (epoch, done, None)
        elif self._resplit is not None:
            self._start = (epoch, 0, self._resplit(epoch, mine["world"], done * self.batch_size))
        else:
            print(
                f"nbdist.restore: the data was scattered over {mine['world']} ranks and is now "
                f"over {self._world}: the loader starts epoch {epoch} from its beginning"
            )
            self._start = (epoch, 0, None)
        self.epoch, self._at = epoch, (epoch, done, math.inf)

    def __repr__(self) -> str:
        return f"<nbdist.ShardLoader {len(self)} batches of {self.batch_size}, epoch {self.epoch}>"


def _take(value: Any, idx: np.ndarray, device):
    """Rows ``idx`` of an array or tensor, as a tensor (strings and the like stay numpy)."""
    import torch

    if isinstance(value, torch.Tensor):
        out = value.index_select(0, torch.from_numpy(idx).to(value.device))
    else:
        rows = np.take(value, idx, axis=0)
        try:
            out = torch.from_numpy(rows)
        except TypeError:
            return rows
    return out if device is None else out.to(device, non_blocking=True)


def _check_rows(rows: int, batch_size: int, drop_last: bool, what: str) -> None:
    if batch_count(rows, batch_size, drop_last) == 0:
        raise UsageError(
            f"batch_size {batch_size} is more than the {rows} rows of {what}, so drop_last=True "
            "leaves no batch: use a smaller batch_size or drop_last=False"
        )


def shard_loader(name, batch_size, shuffle, drop_last, seed, device) -> ShardLoader:
    info = engine.shards.get(name)
    if info is None:
        raise UsageError(
            f"{name!r} was not scattered to this rank: send it from the notebook with "
            f"nbdist.scatter({name!r}, data), or pass a torch Dataset or a path or glob of "
            "Parquet or JSON-lines files"
        )
    ns = namespace()
    if name not in ns:
        raise UsageError(f"{name!r} is no longer defined on rank {info.rank}: scatter it again")
    value = ns[name]
    items = list(value) if isinstance(value, tuple) else [value]
    mine = info.sizes[info.rank]
    if not items or not all(wire.is_array(v) and v.ndim and len(v) == mine for v in items):
        raise UsageError(
            f"{name!r} on rank {info.rank} is no longer the {mine}-row shard that was scattered: "
            "scatter the new value again, or pass it as a torch Dataset"
        )
    target = max(info.sizes)
    _check_rows(target, batch_size, drop_last, f"each rank's shard of {name!r}")
    seed = info.seed if seed is None else seed

    def order_of(epoch: int) -> np.ndarray:
        return epoch_order(mine, target, shuffle=shuffle, seed=seed, epoch=epoch, rank=info.rank)

    def fetch(idx: np.ndarray):
        batch = tuple(_take(v, idx, device) for v in items)
        return batch if isinstance(value, tuple) else batch[0]

    key = f"scattered:{name}:{info.sizes}:{batch_size}:{shuffle}:{seed}:{drop_last}"
    world = len(info.sizes)
    return ShardLoader(
        order_of, target, batch_size, drop_last, fetch=fetch, world=world, fingerprint=key
    )


def dataset_loader(dataset, batch_size, shuffle, drop_last, seed, device, options) -> ShardLoader:
    import torch.utils.data as tud

    if (
        isinstance(dataset, tud.IterableDataset)
        or not hasattr(dataset, "__len__")
        or not hasattr(dataset, "__getitem__")
    ):
        raise UsageError(
            "nbdist.loader needs the name of a scattered variable or a map-style torch Dataset "
            f"(with __len__ and __getitem__), not {type(dataset).__name__}"
        )
    info = context.current()
    n, world = len(dataset), info.world_size
    if n < world:
        raise UsageError(
            f"the dataset has {n} samples but there are {world} ranks: each rank needs at least one"
        )
    rows = math.ceil(n / world)
    _check_rows(rows, batch_size, drop_last, "each rank's part of the dataset")
    seed = 0 if seed is None else seed

    def order_of(epoch: int) -> np.ndarray:
        return dataset_order(n, world, info.rank, shuffle=shuffle, seed=seed, epoch=epoch)

    def resplit(epoch: int, old_world: int, had: int) -> np.ndarray:
        """The epoch's permutation without its head every old rank had read, split anew."""
        whole = dataset_order(n, 1, 0, shuffle=shuffle, seed=seed, epoch=epoch)
        rest = whole[min(had * old_world, n) :]
        return np.resize(rest, math.ceil(len(rest) / world) * world)[info.rank :: world]

    dl = tud.DataLoader(dataset, batch_sampler=_Batches([]), **options)
    key = f"dataset:{n}:{batch_size}:{shuffle}:{seed}:{drop_last}"
    return ShardLoader(
        order_of,
        rows,
        batch_size,
        drop_last,
        dataloader=dl,
        device=device,
        world=world,
        fingerprint=key,
        resplit=resplit,
    )
