"""Shards on an engine: what ``nbdist.scatter`` sent to this rank, and ``loader`` over it.

A scatter lands in two steps, so that a failed one leaves nothing behind: each rank first holds
its shard under a private token (``hold``); only once every rank has its shard does the
notebook make the name visible on all of them (``commit``), and otherwise it asks every rank to
drop the token. Arrays travel as raw buffers (``nbdist.wire``).

``loader`` gives every rank the same number of batches per epoch, even when shards differ in
size: each rank's epoch order is padded cyclically, with its own samples, to the largest shard.
A DDP step is a collective, so one extra batch on one rank would hang the others at the end of
the epoch.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import wire
from ..errors import UsageError
from ..protocol import ShardMeta, ValueInfo
from . import context
from .data.columns import to_device
from .state import engine, namespace


# -- the engine's half of a scatter (called through nbdist.worker.api) -----------------------------
def hold(token: str, meta: ShardMeta, tags: list[str], is_tuple: bool, arrays: tuple) -> int:
    """Hold this rank's shard under ``token`` until the notebook commits it; return its bytes."""
    engine.pending_shards[token] = (wire.unpack(tags, arrays, is_tuple), meta)
    return sum(a.nbytes for a in arrays)


def commit(token: str, name: str) -> None:
    """Make the shard held under ``token`` visible as ``name`` in the user's namespace."""
    value, meta = engine.pending_shards.pop(token)
    namespace()[name] = value
    engine.shards[name] = meta


def describe(name: str) -> ValueInfo | None:
    """What ``gather`` needs to know before it asks for ``name``: None when undefined here."""
    ns = namespace()
    if name not in ns:
        return None
    value = ns[name]
    items = list(value) if isinstance(value, tuple) else [value]
    ok = bool(items) and all(wire.is_array(v) for v in items)
    kind, is_tuple = type(value).__name__, isinstance(value, tuple)
    if not ok:
        return ValueInfo(type=kind, ok=False, is_tuple=is_tuple)
    return ValueInfo(
        type=kind,
        ok=True,
        is_tuple=is_tuple,
        shapes=tuple(tuple(v.shape) for v in items),
        dtypes=tuple(str(v.dtype) for v in items),
        nbytes=sum(
            v.nbytes if isinstance(v, np.ndarray) else v.numel() * v.element_size() for v in items
        ),
    )


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
    reproducible. ``set_epoch(e)`` chooses the next epoch, as with ``DistributedSampler``.
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
    ):
        self._order_of = order_of  # epoch -> this rank's order (the same length on every rank)
        self._rows = rows
        self.batch_size = batch_size
        self.drop_last = drop_last
        self._fetch = fetch  # indices -> batch, for scattered shards
        self._dataloader = dataloader  # torch DataLoader over a Dataset, batch_sampler _Batches
        self._device = device  # where the Dataset's batches go (scattered shards: in fetch)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` epoch number ``epoch``."""
        self.epoch = epoch

    def __len__(self) -> int:
        return batch_count(self._rows, self.batch_size, self.drop_last)

    def __iter__(self):
        """One epoch's batches, each ``next()`` timed as the rank's wait for data."""
        from .reporting.datawait import timed

        batches = split_batches(self._order_of(self.epoch), self.batch_size, self.drop_last)
        self.epoch += 1
        if self._dataloader is None:
            return timed(self._fetch(b) for b in batches)
        self._dataloader.batch_sampler.batches = batches
        if self._device is None:
            return timed(self._dataloader)
        return timed(to_device(b, self._device) for b in self._dataloader)

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


def loader(
    data,
    batch_size: int,
    *,
    shuffle: bool = True,
    drop_last: bool = False,
    seed: int | None = None,
    device=None,
    transform=None,
    skip_unreadable: bool = False,
    shuffle_window: int = 65_536,
    **dataloader_options,
):
    """A loader over this rank's part of the data, with the same number of batches on every
    rank (a DDP step is a collective: one batch more on one rank would hang the others).

    ``data`` is one of:

    - the name of a variable sent by ``nbdist.scatter`` (batches are tensors, or tuples of them
      for a tuple); shorter shards repeat some of their own samples to match the longest;
    - a map-style torch ``Dataset``, sharded by index each epoch as ``DistributedSampler``
      does (the last rank's part padded with the first samples);
    - files read on each rank's host: a path, a glob (``"data/*.parquet"``, ``**`` recurses) or
      a list of them, Parquet or JSON lines, or a Hugging Face ``datasets.Dataset`` (memory-
      mapped, never copied whole). Each rank reads its contiguous part of the epoch's order, each
      of its ``num_workers`` workers its own run of batches; that part is padded, as for a
      Dataset, with the epoch's first samples (``nbdist.worker.data.plan`` has the rule). A batch
      is a dict of column name to tensor (text stays a list). ``shuffle`` shuffles the order of
      the blocks (row groups, runs of lines) and the samples within each ``shuffle_window``
      consecutive ones; a file that cannot be read is named, or with ``skip_unreadable=True``
      left out;
    - a torch ``IterableDataset`` or a Hugging Face ``datasets.IterableDataset``
      (``nbdist.worker.data.iterables``).

    ``dataloader_options`` (``num_workers``, ``pin_memory``, ...) go to torch's ``DataLoader``
    (not for a scattered name). ``drop_last`` drops each epoch's last, short batch. ``seed``
    defaults to the scatter's seed (0 otherwise); ``device`` moves each batch there;
    ``transform`` is called on each batch in the loader's workers. Every loader but a scattered
    name's keeps its position: pass it as ``loader=`` to ``nbdist.checkpoint``,
    ``nbdist.restore`` and ``nbdist.steps``, and a resumed run continues the epoch exactly.
    """
    context.current()  # a clear error in the notebook: loaders run on the engines
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise UsageError(f"batch_size must be a whole number >= 1, not {batch_size!r}")
    for key in ("sampler", "batch_sampler"):
        if key in dataloader_options:
            raise UsageError(f"nbdist.loader chooses the {key} itself: leave {key}= out")
    if transform is not None and not callable(transform):
        raise UsageError(f"transform must be a function of a batch, not {transform!r}")
    if isinstance(data, str) and data in engine.shards or not _streamed(data):
        if transform is not None:
            raise UsageError("transform= applies to files and iterable datasets only")
        if isinstance(data, str):
            if dataloader_options:
                raise UsageError(
                    f"{sorted(dataloader_options)} apply to a torch Dataset only; a scattered "
                    "name is already in memory"
                )
            return _shard_loader(data, batch_size, shuffle, drop_last, seed, device)
        return _dataset_loader(
            data, batch_size, shuffle, drop_last, seed, device, dataloader_options
        )
    from .data import streamed

    return streamed.loader(
        data,
        batch_size,
        shuffle=shuffle,
        drop_last=drop_last,
        seed=0 if seed is None else seed,
        device=device,
        transform=transform,
        skip_unreadable=skip_unreadable,
        window=shuffle_window,
        options=dataloader_options,
    )


def _streamed(data) -> bool:
    """Is ``data`` files, a Hugging Face dataset or an iterable dataset (not a scattered name
    nor a map-style torch Dataset)?"""
    from .data import streamed

    return streamed.handles(data)


def _check_rows(rows: int, batch_size: int, drop_last: bool, what: str) -> None:
    if batch_count(rows, batch_size, drop_last) == 0:
        raise UsageError(
            f"batch_size {batch_size} is more than the {rows} rows of {what}, so drop_last=True "
            "leaves no batch: use a smaller batch_size or drop_last=False"
        )


def _shard_loader(name, batch_size, shuffle, drop_last, seed, device) -> ShardLoader:
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

    return ShardLoader(order_of, target, batch_size, drop_last, fetch=fetch)


def _dataset_loader(dataset, batch_size, shuffle, drop_last, seed, device, options) -> ShardLoader:
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

    dl = tud.DataLoader(dataset, batch_sampler=_Batches([]), **options)
    return ShardLoader(order_of, rows, batch_size, drop_last, dataloader=dl, device=device)
