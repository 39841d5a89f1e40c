"""``nbdist.loader``: the one door to every loader of this folder. It checks what every loader
takes, then hands a scattered name or a map-style torch ``Dataset`` to ``indexed``, and files,
Hugging Face datasets and iterable datasets to ``streamed``."""

from __future__ import annotations

from ...errors import UsageError
from .. import context
from ..state import engine
from . import indexed, streamed


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
    shuffle_window: int | None = None,
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
      a list of them, Parquet, JSON lines or WebDataset tar shards (``.tar``: a sample's files
      as bytes, by extension), or a Hugging Face ``datasets.Dataset`` (memory-mapped, never
      copied whole). Each rank reads its contiguous part of the epoch's order, each
      of its ``num_workers`` workers its own run of batches; that part is padded, as for a
      Dataset, with the epoch's first samples (``nbdist.worker.data.plan`` has the rule). A batch
      is a dict of column name to tensor (text stays a list). ``shuffle`` shuffles the order of
      the blocks (row groups, runs of lines or samples) and the samples within each
      ``shuffle_window`` consecutive ones (65,536 by default; a stream's worker holds its
      window, 1,000 by default); a file that cannot be read is named, or with
      ``skip_unreadable=True`` left out;
    - a torch ``IterableDataset`` or a Hugging Face ``datasets.IterableDataset``
      (``nbdist.worker.data.iterables``).

    ``dataloader_options`` (``num_workers``, ``pin_memory``, ...) go to torch's ``DataLoader``
    (not for a scattered name). ``drop_last`` drops each epoch's last, short batch. ``seed``
    defaults to the scatter's seed (0 otherwise); ``device`` moves each batch there;
    ``transform`` is called on each batch in the loader's workers. Every loader keeps its
    position: pass it as ``loader=`` to ``nbdist.checkpoint``, ``nbdist.restore`` and
    ``nbdist.steps``, and a resumed run continues the epoch exactly.
    """
    context.current()  # a clear error in the notebook: loaders run on the engines
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise UsageError(f"batch_size must be a whole number >= 1, not {batch_size!r}")
    for key in ("sampler", "batch_sampler"):
        if key in dataloader_options:
            raise UsageError(f"nbdist.loader chooses the {key} itself: leave {key}= out")
    if transform is not None and not callable(transform):
        raise UsageError(f"transform must be a function of a batch, not {transform!r}")
    if isinstance(data, str) and data in engine.shards or not streamed.handles(data):
        if transform is not None:
            raise UsageError("transform= applies to files and iterable datasets only")
        if isinstance(data, str):
            if dataloader_options:
                raise UsageError(
                    f"{sorted(dataloader_options)} apply to a torch Dataset only; a scattered "
                    "name is already in memory"
                )
            return indexed.shard_loader(data, batch_size, shuffle, drop_last, seed, device)
        return indexed.dataset_loader(
            data, batch_size, shuffle, drop_last, seed, device, dataloader_options
        )
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
