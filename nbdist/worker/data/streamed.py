"""What ``nbdist.loader`` hands to the loaders of this folder: files and Hugging Face
``Dataset``s to ``blocks``, streams that can only be iterated to ``iterables``; the checks every
rank makes before it reads anything (and before any collective), one line each."""

from __future__ import annotations

from typing import Any

from ...errors import UsageError
from .. import context
from . import blocks, plan, sources


def handles(data: Any) -> bool:
    """Is ``data`` for one of this folder's loaders?"""
    return sources.is_files(data) or _hf(data, "Dataset") or _iterable(data)


def loader(
    data: Any,
    batch_size: int,
    *,
    shuffle: bool,
    drop_last: bool,
    seed: int,
    device: Any,
    transform: Any,
    skip_unreadable: bool,
    window: int | None,
    options: dict,
) -> Any:
    """The loader for ``data`` on this rank (``nbdist.loader`` has checked its arguments)."""
    if window is not None and (
        isinstance(window, bool) or not isinstance(window, int) or window < 1
    ):
        raise UsageError(f"shuffle_window must be a whole number >= 1, not {window!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise UsageError(f"seed must be a whole number, not {seed!r}")
    info = context.current()
    if _iterable(data):
        from .iterables import iterable_loader

        return iterable_loader(
            data,
            batch_size,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            device=device,
            transform=transform,
            options=options,
            **({} if window is None else {"window": window}),
        )
    if options.get("persistent_workers"):
        raise UsageError(
            "nbdist.loader starts its workers each epoch, with that epoch's part of the data: "
            "leave persistent_workers= out"
        )
    source = sources.Table(data) if _hf(data, "Dataset") else sources.files(data, skip_unreadable)
    rows = sum(source.sizes)
    workers = max(int(options.get("num_workers", 0) or 0), 1)
    if rows < info.world_size * workers:
        readers = f"{info.world_size} rank(s) × {workers} worker(s)"
        raise UsageError(
            f"nbdist.loader: {source.describe()} is fewer samples than the {readers} that "
            "each need one: use fewer num_workers or ranks, or more data"
        )
    per = -(-rows // info.world_size)
    if plan.batch_count(per, batch_size, drop_last) == 0:
        raise UsageError(
            f"batch_size {batch_size} is more than the {per} rows of each rank's part, so "
            "drop_last=True leaves no batch: use a smaller batch_size or drop_last=False"
        )
    _same_everywhere(source, info.rank)
    window = blocks.WINDOW if window is None else window
    settings = blocks.Settings(batch_size, shuffle, seed, drop_last, window)
    return blocks.BlockLoader(
        source,
        settings,
        info.rank,
        info.world_size,
        device=device,
        transform=transform,
        options=options,
    )


def _hf(data: Any, name: str) -> bool:
    """Is ``data`` a Hugging Face ``datasets`` object of class ``name`` (without importing it)?"""
    return any(
        c.__name__ == name and c.__module__.startswith("datasets.") for c in type(data).__mro__
    )


def _iterable(data: Any) -> bool:
    if _hf(data, "IterableDataset"):
        return True
    try:
        import torch.utils.data as tud
    except ImportError:
        return False
    return isinstance(data, tud.IterableDataset)


def _same_everywhere(source: Any, rank: int) -> None:
    """Every rank must plan over the same data (each indexes the files on its own host): one
    small all-gather of what each found, the same line on every rank when they differ."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    found: list = [None] * dist.get_world_size()
    dist.all_gather_object(found, (source.fingerprint(), source.describe()))
    if len({f for f, _ in found}) > 1:
        seen = "; ".join(f"rank {r}: {d}" for r, (_, d) in enumerate(found))
        raise UsageError(
            f"nbdist.loader: the ranks see different data ({seen}): every rank must read the "
            "same files (a shared file system, or the same copy on every host)"
        )
