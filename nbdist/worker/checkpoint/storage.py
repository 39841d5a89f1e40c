"""Where a sharded checkpoint meets the disk: torch.distributed.checkpoint's file storage, made
private, atomic and safe to read.

Written: every rank's shards go into one fresh 0700 folder beside the checkpoints
(``temp_folder``), each file created 0600 (``Writer``); once ``dcp.save`` has returned on every
rank, rank 0 ``commit``s it: synced, renamed to ``step-N.dcp``, then marked with each file's size
and SHA-256 (``files``), so a step is whole or ignored.

Read: ``SafeReader`` loads the ``.metadata`` pickle with ``contents.load_metadata`` (DCP's own
reader would ``pickle.load`` it; it refuses items whose file is not a plain file in the folder)
and opens the shards without following a link; ``SafePlanner`` loads the byte items (everything
that is not a tensor: random states, optimizer settings, plain values) with
``weights_only=True``, which DCP's default planner does not; its tensors DCP already loads so.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from ...errors import UsageError
from . import contents, files

METADATA = ".metadata"  # DCP's name for the file rank 0 writes last


class _PrivateFiles(FileSystem):
    """DCP's local file system, creating files 0600 and folders 0700, never following a link
    to a file, and remembering the files this process created."""

    def __init__(self) -> None:
        super().__init__()
        self.created: list[str] = []

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        if "w" not in mode:  # a link swapped in after the metadata was checked: ELOOP
            with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), mode) as stream:
                yield stream
            return
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        os.fchmod(fd, 0o600)  # exactly 0600, whatever the umask
        self.created.append(Path(path).name)
        with os.fdopen(fd, mode) as stream:
            yield stream

    def mkdir(self, path: str | os.PathLike) -> None:
        os.makedirs(path, mode=0o700, exist_ok=True)


class Writer(FileSystemWriter):
    """DCP's file writer over ``_PrivateFiles``: one file per rank, synced."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=True, overwrite=True)
        self.fs = _PrivateFiles()

    def written(self) -> list[str]:
        """The files this rank wrote (rank 0's metadata under its final name)."""
        return sorted({METADATA if n == f"{METADATA}.tmp" else n for n in self.fs.created})


class SafeReader(FileSystemReader):
    """DCP's file reader, whose metadata is unpickled with only DCP's own records allowed and
    names only plain files in the folder, which are opened without following a link."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.fs = _PrivateFiles()
        self.refused: UsageError | None = None  # DCP keeps only its text: raise it whole

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint.metadata import StorageMeta

        if kwargs.get("rank") is not None:  # a per-rank metadata file: never written here
            raise FileNotFoundError(f"{self.path}: no per-rank metadata")
        try:
            metadata = contents.load_metadata(Path(self.path) / METADATA)
        except UsageError as e:
            self.refused = e
            raise
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafePlanner(DefaultLoadPlanner):
    """DCP's load planner, loading byte items with ``torch.load(weights_only=True)``."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        import torch

        fqn = read_item.dest_index.fqn
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:
            raise UsageError(
                f"nbdist.restore: the checkpoint's item {fqn!r} is not made of tensors and plain "
                f"values ({files.refusal(e)}): delete that checkpoint"
            ) from None
        if not self.flatten_state_dict:
            self.state_dict[fqn] = loaded
            return
        at: Any = self.original_state_dict
        *path, last = self.mappings[fqn]
        for key in path:  # the target already holds this place: only its value is replaced
            at = at[key]
        at[last] = loaded


def temp_folder(folder: Path, step: int) -> Path:
    """A fresh private folder beside the checkpoints, where every rank writes its shards of
    the checkpoint of ``step`` before ``commit`` (rank 0 makes it)."""
    tmp = files.temp_name(folder / f"{files.stem(step)}.dcp")
    try:
        files.remove(tmp)  # left by a killed attempt of this process
        os.mkdir(tmp, 0o700)
        os.chmod(tmp, 0o700)
    except OSError as e:
        raise files.storage_error(f"make {tmp.name}", folder, e) from None
    return tmp


def commit(folder: Path, step: int, tmp: Path, listing: dict, header: dict) -> None:
    """The checkpoint written into ``tmp`` (``listing``: each file's size and SHA-256, from the
    rank that wrote it) made the checkpoint of ``step``: synced, renamed to ``step-N.dcp``, then
    marked (``header``: what the loaders need to know: world size, stages, kinds)."""
    name = files.stem(step)
    final, mark = folder / f"{name}.dcp", folder / f"{name}.json"
    try:
        if {p.name for p in tmp.iterdir()} != set(listing):
            raise OSError(errno.EIO, "the files written are not the ones the ranks listed")
        files.sync_folder(tmp)
        mark.unlink(missing_ok=True)  # an earlier checkpoint of this step no longer counts
        files.remove(final)
        (folder / f"{name}.pt").unlink(missing_ok=True)
        os.rename(tmp, final)
        files.sync_folder(folder)
        for n in listing:
            files.trust(folder, final / n)  # hashed by its writer as it was written
        marker = {"step": step, "format": "dcp", **header, "files": listing}
        files.write_atomic(mark, json.dumps(marker).encode())
    except OSError as e:
        files.remove(tmp)
        raise files.storage_error(f"write {name}.dcp", folder, e) from None
