"""Where a loader's samples come from, as blocks of known size read one at a time: Parquet
files (a block is a row group), JSON-lines files (a block is ``JSONL_BLOCK`` lines, found by one
scan of the file for its line ends), WebDataset tar shards (``tars``) and a Hugging Face
``datasets.Dataset`` (a block is ``TABLE_BLOCK`` rows of its memory-mapped Arrow table, never
copied whole).

``files(spec, skip_unreadable)`` turns a path, a glob, or a list of them into a ``Files`` source,
checking each file as it indexes it: what cannot be read is named in one line (or left out,
named, with ``skip_unreadable=True``). A block is read as a ``pyarrow.Table``: pyarrow decodes,
nbdist only says which rows.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import UsageError
from . import tars

JSONL_BLOCK = 8192  # lines of a JSON-lines block
TABLE_BLOCK = 8192  # rows of a block of a Hugging Face Dataset
PARQUET = (".parquet", ".pq")
JSONL = (".jsonl", ".json", ".ndjson")
_SCAN = 16 << 20  # bytes read at a time while finding a JSON-lines file's line ends
_TAIL = 1 << 20  # bytes from a JSON-lines file's end in which its last line is looked for


def pyarrow() -> Any:
    """pyarrow, or one line saying how to install it."""
    try:
        import pyarrow as pa
    except ImportError:
        raise UsageError(
            "nbdist.loader reads files with pyarrow, which is not installed on this engine: "
            "pip install pyarrow"
        ) from None
    return pa


@dataclass(frozen=True)
class _Block:
    file: int  # index in Files.paths
    rows: int
    group: int = 0  # Parquet: the row group
    start: int = 0  # JSON lines: byte range
    stop: int = 0


@dataclass
class Files:
    """Parquet and JSON-lines files, as blocks in the files' order."""

    paths: list[str]
    blocks: list[_Block]
    columns: list[str] = field(default_factory=list)  # the first file's columns
    schema: Any = None  # their types, from its first block: every block is read as these
    _open: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(b.rows for b in self.blocks)

    def fingerprint(self) -> str:
        """The same for the same files holding the same rows, wherever they are read."""
        text = "|".join(f"{os.path.basename(p)}" for p in self.paths) + repr(self.sizes)
        return "files:" + hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> str:
        n = len(self.paths)
        return f"{n} file{'s' * (n != 1)}, {sum(self.sizes):,} rows"

    def read(self, block: int):
        """Block ``block`` as a ``pyarrow.Table``."""
        b = self.blocks[block]
        path = self.paths[b.file]
        try:
            if path.endswith(PARQUET):
                table = self._parquet(path).read_row_group(b.group)
            elif path.endswith(tars.TAR):
                table = tars.read(path, b.start, b.stop, b.rows, self.columns)
            else:
                table = _read_jsonl(path, b.start, b.stop, b.rows)
            if self.schema is None or table.schema == self.schema:
                return table
            return table.select(self.schema.names).cast(self.schema)
        except UsageError:
            raise
        except Exception as e:  # a file changed or broke after it was indexed
            raise UsageError(f"nbdist.loader: cannot read {path}: {_why(e)}") from None

    def _parquet(self, path: str):
        import pyarrow.parquet as pq

        if path not in self._open:
            self._open[path] = pq.ParquetFile(path)
        return self._open[path]

    def __getstate__(self) -> dict:  # open files stay in the process that opened them
        return {**self.__dict__, "_open": {}}


@dataclass
class Table:
    """A Hugging Face ``datasets.Dataset``: its Arrow table in blocks of ``TABLE_BLOCK`` rows."""

    dataset: Any

    @property
    def sizes(self) -> tuple[int, ...]:
        n = len(self.dataset)
        return tuple(min(TABLE_BLOCK, n - s) for s in range(0, n, TABLE_BLOCK))

    def fingerprint(self) -> str:
        return f"dataset:{getattr(self.dataset, '_fingerprint', '')}:{len(self.dataset)}"

    def describe(self) -> str:
        return f"a Dataset of {len(self.dataset):,} rows"

    def read(self, block: int):
        start = block * TABLE_BLOCK
        arrow = self.dataset.with_format("arrow")
        return arrow[start : start + self.sizes[block]]


def files(spec: Any, skip_unreadable: bool) -> Files:
    """The files a path, a glob or a list of them name, in sorted order per pattern, indexed."""
    patterns = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    paths: list[str] = []
    for p in patterns:
        if not isinstance(p, (str, os.PathLike)):
            raise UsageError(
                f"nbdist.loader: a list of files holds paths or globs, not {type(p).__name__}"
            )
        p = os.path.expanduser(os.fspath(p))
        found = sorted(glob.glob(p, recursive=True)) if glob.has_magic(p) else [p]
        found = [f for f in found if not os.path.isdir(f)]
        if not found or not os.path.exists(found[0]):
            where = "" if os.path.isabs(p) else f" (relative to {os.getcwd()})"
            raise UsageError(
                f"nbdist.loader: {p!r} matches no file{where} on this rank's host: check the "
                "path; each rank reads the files from its own host"
            )
        paths += found
    paths = list(dict.fromkeys(paths))
    for p in paths:
        if not p.endswith(PARQUET + JSONL + tars.TAR):
            raise UsageError(
                f"nbdist.loader reads Parquet ({', '.join(PARQUET)}), JSON lines "
                f"({', '.join(JSONL)}) and WebDataset tar shards (.tar); {p} is none of them: "
                "convert it, or pass a torch Dataset"
            )
    kept, blocks, skipped, names = [], [], [], None
    for p in paths:
        try:
            mine, columns = _index(p)
        except Exception as e:
            if not skip_unreadable:
                raise UsageError(
                    f"nbdist.loader: cannot read {p}: {_why(e)}; fix or remove it, or pass "
                    "skip_unreadable=True to train without it"
                ) from None
            skipped.append(p)
            continue
        if mine and names is None:
            names, first = columns, p
        elif mine and not set(names) <= set(columns):
            missing = ", ".join(repr(c) for c in names if c not in columns)
            raise UsageError(
                f"nbdist.loader: {p} has no column {missing}, which {first} has: give every "
                "file the same columns, or list only the files that have them"
            )
        blocks += [_Block(len(kept), **b) for b in mine]
        kept.append(p)
    if skipped:
        print(f"nbdist.loader: left out {len(skipped)} unreadable file(s): {', '.join(skipped)}")
    found = Files(kept, blocks, names or [])
    if blocks:  # the columns every block is read as: the first block's
        found.schema = found.read(0).schema
    return found


def _why(e: Exception) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text if len(text) < 200 else text[:200] + "…"


def _index(path: str) -> tuple[list[dict], list[str]]:
    if path.endswith(PARQUET):
        return _index_parquet(path)
    return tars.index(path) if path.endswith(tars.TAR) else _index_jsonl(path)


def _index_parquet(path: str) -> tuple[list[dict], list[str]]:
    """Its row groups, and its columns: from the file's footer alone."""
    import pyarrow.parquet as pq

    pyarrow()
    file = pq.ParquetFile(path)
    meta = file.metadata
    groups = (meta.row_group(g).num_rows for g in range(meta.num_row_groups))
    return [{"rows": n, "group": g} for g, n in enumerate(groups) if n], file.schema_arrow.names


def _index_jsonl(path: str) -> tuple[list[dict], list[str]]:
    """Blocks of ``JSONL_BLOCK`` lines (the byte offset of every such line's start), and the
    columns of its first line. Its first and last lines are parsed here (a file cut short
    while written fails now); the others as they are read."""
    blocks = _jsonl_blocks(path)
    if not blocks:
        return [], []
    with open(path, "rb") as f:
        head = json.loads(f.readline())
        f.seek(max(0, blocks[-1]["stop"] - _TAIL))
        json.loads(f.read().rstrip(b"\n").rsplit(b"\n", 1)[-1])
    if not isinstance(head, dict):
        raise ValueError(f"its first line is a {type(head).__name__}, not an object")
    return blocks, list(head)


def _jsonl_blocks(path: str) -> list[dict]:
    starts, lines, at, last = [0], 0, 0, b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(_SCAN):
            ends = np.flatnonzero(np.frombuffer(chunk, np.uint8) == 10)
            # the line ends that close every JSONL_BLOCK-th line
            first = (-lines - 1) % JSONL_BLOCK
            starts += (at + ends[first::JSONL_BLOCK] + 1).tolist()
            lines += len(ends)
            at += len(chunk)
            last = chunk[-1:]
    if last != b"\n":  # a last line without its line end
        lines += 1
    if starts[-1] >= at:
        starts.pop()
    if not starts:  # an empty file
        return []
    bounds = [*starts, at]
    sizes = [JSONL_BLOCK] * (len(starts) - 1) + [lines - JSONL_BLOCK * (len(starts) - 1)]
    return [
        {"rows": n, "start": a, "stop": b}
        for n, a, b in zip(sizes, bounds[:-1], bounds[1:], strict=True)
        if n
    ]


def _read_jsonl(path: str, start: int, stop: int, rows: int):
    import pyarrow.json as pj

    pa = pyarrow()
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(stop - start)
    table = pj.read_json(pa.BufferReader(data))
    if table.num_rows != rows:
        raise UsageError(
            f"nbdist.loader: {path} bytes {start}-{stop} hold {table.num_rows} JSON lines, not "
            f"{rows}: a JSON-lines file holds one object per line (no blank lines), and must "
            "not change while a loader reads it"
        )
    return table


def is_files(data: Any) -> bool:
    """Does ``data`` name files (a path, a glob, or a list of them) rather than a variable?"""
    if isinstance(data, Path):
        return True
    if isinstance(data, str):
        return glob.has_magic(data) or os.sep in data or data.endswith(PARQUET + JSONL + tars.TAR)
    return isinstance(data, (list, tuple)) and bool(data) and isinstance(data[0], (str, Path))
