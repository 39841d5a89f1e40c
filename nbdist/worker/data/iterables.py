"""``nbdist.loader`` over streams that can only be iterated: a torch ``IterableDataset`` and a
Hugging Face ``datasets.IterableDataset`` (streaming).

**Who reads what** (``splitting``). A Hugging Face stream is split by ``datasets`` itself:
across ranks by ``split_dataset_by_node`` (each rank reads only its files when their number
divides by the ranks'; otherwise every rank reads them all and keeps 1 sample in ``world``), and
across a rank's ``num_workers`` by files. A torch ``IterableDataset`` is split by position, and
every worker reads it whole and keeps its part: give it one that yields the whole stream in every
worker (not one that splits itself by ``get_worker_info``), or write it to files, of which
``nbdist.loader`` reads only each worker's part.

**Equal steps.** Every rank yields the same number of batches per epoch. When the length is
known (``len(dataset)``), it is computed: each worker batches its own samples, a rank has the sum
of its workers' batches, and every rank stops at the fewest any rank has (``epoch_batches``); the
few batches past that on other ranks go unused this epoch. When it is not known, the ranks agree
on each batch (an all-reduce MIN of "I have one" over the default group, run while the batch
before trains), and the epoch ends for all when the first rank runs out: what the others had left
goes unused this epoch (with files of very different sizes that can be much; ``nbdist.loader``
over the files evens them out).

**Shuffle.** Within each worker, by windows of ``window`` consecutive samples, each permuted from
seed, epoch, rank, worker and window; a Hugging Face stream's file order also changes with seed
and epoch (its ``set_epoch``). Hugging Face's own shuffle buffer is not used: its content is lost
on a resume, where nbdist's window is read again.

**Resume.** Torchdata's ``StatefulDataLoader`` keeps the position of the loader and of each of
its workers' ``SplitStream``; it restores exactly with as many ranks and workers. A stream with
neither a length nor ``state_dict``/``load_state_dict`` is refused: it could not be resumed.
"""

from __future__ import annotations

import copy
import inspect
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.utils.data as tud

from ...errors import UsageError
from .. import context
from ..reporting.datawait import timed
from . import columns
from .splitting import SHUFFLE_WINDOW, SplitStream, epoch_batches


class _Collate:
    """Torch's default collate (or the person's ``collate_fn``), then ``transform``: in the
    workers. A class, so that spawned workers can unpickle it."""

    def __init__(self, collate, transform) -> None:
        self.collate, self.transform = collate, transform

    def __call__(self, samples: list) -> Any:
        batch = self.collate(samples)
        return batch if self.transform is None else self.transform(batch)


class _Live:
    """The epoch being handed out: its number, batches so far, and whether it ran to its end."""

    def __init__(self, epoch: int, batches: int) -> None:
        self.epoch, self.batches, self.ended = epoch, batches, False
        self.position: dict | None = None  # the loader's, when it has read ahead of it


# -- the loader -----------------------------------------------------------------------------------
class IterableLoader:
    """Batches of a stream for this rank: the same number on every rank (the module's rule).

    Each ``iter()`` is one epoch (0, 1, ...; ``set_epoch`` chooses the next one, from its
    start). ``state_dict()`` is this rank's position, plain values for a checkpoint; given back
    to ``_resume`` by ``nbdist.restore``, the next ``iter()`` continues where it stood.
    """

    def __init__(
        self,
        stream: SplitStream,
        dataloader,
        *,
        rank: int,
        length: int | None,
        device,
        flag,
        fingerprint: dict,
    ) -> None:
        self.stream, self._dl, self.rank = stream, dataloader, rank
        self._length, self._device = length, device
        self._flag = flag  # where the ranks' "I have a batch" lives; None: no agreement needed
        self._fingerprint = fingerprint
        self.batch_size = fingerprint["batch_size"]
        self.epoch = 0
        self._resumed: dict | None = None  # a position given back, for the next iter()
        self._live: _Live | None = None

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` epoch number ``epoch``, from its start (a position given
        back for that same epoch stands)."""
        self.epoch, self._live = epoch, None
        if self._resumed is not None and self._resumed["epoch"] != epoch:
            self._resumed = None

    def __len__(self) -> int:
        if self._length is None:
            raise TypeError(
                "this stream's length is unknown: its epochs end when the first rank runs out"
            )
        return self._length

    def __iter__(self) -> Iterator[Any]:
        resumed, self._resumed = self._resumed, None
        epoch, self.epoch = self.epoch, self.epoch + 1
        self.stream.set_epoch(epoch)
        if resumed is not None:
            self._dl.load_state_dict(resumed["loader"])
        live = self._live = _Live(epoch, resumed["batches"] if resumed is not None else 0)
        batches = self._counted if self._flag is None else self._agreed
        return timed(batches(iter(self._dl), live))

    def __repr__(self) -> str:
        f = self._fingerprint
        n = "an unknown number of" if self._length is None else self._length
        return (
            f"<nbdist loader: a stream ({f['dataset']}), {n} batches of {self.batch_size} per "
            f"rank, epoch {self.epoch}>"
        )

    def _counted(self, it: Iterator[Any], live: _Live) -> Iterator[Any]:
        """A known length (or one rank): that many batches, no collective."""
        while self._length is None or live.batches < self._length:
            batch = next(it, _END)
            if batch is _END:
                if self._length is None:
                    break
                raise UsageError(
                    f"nbdist.loader: the stream ended after {live.batches} of the "
                    f"{self._length} batches its length gives: make its __len__ its true length"
                )
            live.batches += 1
            yield batch if self._device is None else columns.to_device(batch, self._device)
        live.ended = True

    def _agreed(self, it: Iterator[Any], live: _Live) -> Iterator[Any]:
        """An unknown length: a batch is handed out once every rank has one. The agreement on the
        next batch (an all-reduce MIN, asynchronous) runs while this one trains; the position
        handed out is the loader's, taken before the next batch was fetched."""
        ahead = self._fetch(it)
        while True:
            batch, position, flag, agreement = ahead
            agreement.wait()
            if not flag.item():
                break
            ahead = self._fetch(it)
            live.batches, live.position = live.batches + 1, position
            yield batch if self._device is None else columns.to_device(batch, self._device)
        live.ended = True

    def _fetch(self, it: Iterator[Any]) -> tuple:
        batch = next(it, _END)
        position = copy.deepcopy(self._dl.state_dict())
        flag = torch.tensor([0 if batch is _END else 1], device=self._flag)
        agreement = dist.all_reduce(flag, op=dist.ReduceOp.MIN, async_op=True)
        return batch, position, flag, agreement

    # -- the position ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """This rank's position: plain values, for a weights-only checkpoint."""
        if self._resumed is not None:  # given back and not yet iterated: it still stands
            return dict(self._resumed)
        live, n = self._live, self._length
        own = {"kind": "stream", "fingerprint": dict(self._fingerprint)}
        if live is None or live.ended or (n is not None and live.batches >= n):
            return {**own, "epoch": self.epoch, "batches": 0, "loader": None}
        return {
            **own,
            "epoch": live.epoch,
            "batches": live.batches,
            "loader": live.position if live.position is not None else self._dl.state_dict(),
        }

    def _resume(self, saved: list[dict | None]) -> None:
        """Continue from this rank's saved position (``saved``: every rank's, by rank)."""
        world = self._fingerprint["world"]
        if len(saved) != world:
            raise UsageError(
                f"nbdist.restore: a stream cannot be re-split over another number of ranks (the "
                f"checkpoint's loader ran on {len(saved)}, this one on {world}): restore on "
                f"{len(saved)} ranks, or read the data from files or a map-style Dataset, whose "
                "epoch nbdist.loader splits over any number"
            )
        mine = saved[self.rank]
        if not isinstance(mine, dict) or mine.get("kind") != "stream":
            raise UsageError(
                f"nbdist.restore: the checkpoint holds no stream position for rank {self.rank}: "
                "restore with the loader it was saved with, or without loader="
            )
        theirs = mine["fingerprint"]
        differ = [
            f"{k} {theirs.get(k)!r} there, {v!r} here"
            for k, v in self._fingerprint.items()
            if theirs.get(k) != v
        ]
        if differ:
            raise UsageError(
                f"nbdist.restore: the checkpoint's loader position is another loader's "
                f"({'; '.join(differ)}): make the loader as it was when the checkpoint was saved"
            )
        self.epoch, self._live = mine["epoch"], None
        self._resumed = dict(mine) if mine["loader"] is not None else None


def iterable_loader(
    dataset,
    batch_size: int,
    *,
    shuffle: bool,
    seed: int,
    drop_last: bool,
    device,
    transform,
    options: dict,
    window: int = SHUFFLE_WINDOW,
    rank: int | None = None,
    world: int | None = None,
) -> IterableLoader:
    """``nbdist.loader`` over a torch ``IterableDataset`` or a Hugging Face
    ``datasets.IterableDataset`` on this rank (the module's text has the rules); ``options`` go
    to the ``DataLoader``, ``transform`` is called on each batch in its workers. Every check
    comes first, one line each, before any collective. ``rank``, ``world``: this engine's unless
    given (tests without a cluster)."""
    if rank is None or world is None:
        info = context.current()
        rank, world = info.rank, info.world_size
    from torchdata.stateful_dataloader import StatefulDataLoader

    hf = _is_hf(dataset)
    kind = "datasets.IterableDataset" if hf else type(dataset).__name__
    if not hf and not isinstance(dataset, tud.IterableDataset):
        raise UsageError(
            "nbdist.loader streams a torch IterableDataset or a Hugging Face "
            f"datasets.IterableDataset, not {kind}"
        )
    options = dict(options)
    workers = options.get("num_workers", 0) or 0
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise UsageError(f"num_workers must be a whole number >= 0, not {workers!r}")
    if options.get("in_order", True) is not True:
        raise UsageError(
            "nbdist.loader keeps a stream's position, which in_order=False does not have: "
            "leave in_order= out"
        )
    stateful = hf or all(callable(getattr(dataset, m, None)) for m in _STATE)
    n = None if hf else _length(dataset)  # samples, when known
    if not stateful and n is None:
        raise UsageError(
            f"nbdist.loader: the {kind} has neither a length nor state_dict/load_state_dict, so "
            "its position cannot be kept: give it __len__ (nbdist then replays it to resume) or "
            "state_dict() and load_state_dict(), or write it to Parquet or JSON-lines files "
            "and pass their paths"
        )
    batches = None  # per epoch, when known
    if n is not None:
        _check_length(n, world, max(workers, 1), batch_size, drop_last, kind)
        batches = epoch_batches(n, world, max(workers, 1), batch_size, drop_last)
    flag = _flag_device() if batches is None and world > 1 else None
    if hf and getattr(dataset, "_distributed", None) is not None:
        raise UsageError(
            "nbdist.loader splits a Hugging Face stream over the ranks itself: pass it whole, "
            "not split_dataset_by_node's part"
        )
    if hf and world > 1:
        from datasets.distributed import split_dataset_by_node

        dataset = split_dataset_by_node(dataset, rank=rank, world_size=world)
    if hf and getattr(dataset, "_formatting", None) is None:  # rows as tensors: lists stack
        dataset = dataset.with_format("torch")
    stream = SplitStream(
        dataset,
        rank=rank,
        world=world,
        splits=not hf,
        stateful=stateful,
        shuffle=shuffle,
        seed=seed,
        window=window,
    )
    collate = _Collate(options.pop("collate_fn", None) or tud.default_collate, transform)
    unknown = sorted(set(options) - _options(StatefulDataLoader))
    if unknown:
        raise UsageError(f"nbdist.loader: {', '.join(unknown)}: no option of torch's DataLoader")
    try:
        with warnings.catch_warnings():  # torchdata 0.11 calls torch's deprecated set_vital
            warnings.filterwarnings("ignore", "'set_vital' is deprecated", UserWarning)
            dl = StatefulDataLoader(
                stream, batch_size=batch_size, drop_last=drop_last, collate_fn=collate, **options
            )
    except (TypeError, ValueError) as e:
        raise UsageError(f"nbdist.loader: {e}") from None
    fingerprint = {
        "dataset": kind,
        "samples": n,
        "batch_size": batch_size,
        "drop_last": drop_last,
        "shuffle": shuffle,
        "seed": seed,
        "window": window,
        "world": world,
        "workers": workers,
    }
    return IterableLoader(
        stream, dl, rank=rank, length=batches, device=device, flag=flag, fingerprint=fingerprint
    )


_STATE = ("state_dict", "load_state_dict")
_END = object()  # a stream's end


def _is_hf(dataset) -> bool:
    return any(
        c.__name__ == "IterableDataset" and c.__module__.startswith("datasets.")
        for c in type(dataset).__mro__
    )


def _length(dataset) -> int | None:
    try:
        return int(len(dataset))
    except (TypeError, NotImplementedError):
        return None


def _check_length(n: int, world: int, workers: int, batch_size: int, drop_last: bool, kind: str):
    if n < world * workers:
        raise UsageError(
            f"nbdist.loader: the {kind} has {n} samples, fewer than the {world} rank(s) × "
            f"{workers} worker(s) that each need one: use fewer num_workers or ranks, or more data"
        )
    if epoch_batches(n, world, workers, batch_size, drop_last) == 0:
        raise UsageError(
            f"batch_size {batch_size} is more than each worker's part of the {n} samples, so "
            "drop_last=True leaves no batch: use a smaller batch_size or drop_last=False"
        )


def _options(loader_class) -> set[str]:
    """The DataLoader's options a person may give (nbdist sets the rest)."""

    mine = {"self", "dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"}
    return set(inspect.signature(loader_class).parameters) - mine


def _flag_device():
    """Where the ranks' agreement lives: the CPU for gloo, this rank's GPU for nccl."""
    if not (dist.is_available() and dist.is_initialized()):
        raise UsageError(
            "nbdist.loader: the ranks agree on the end of a stream of unknown length over "
            "their default group: make the loader inside a %%distributed cell"
        )
    backend = str(dist.get_backend())
    return torch.device("cpu") if "gloo" in backend or "mpi" in backend else context.device()
