"""WebDataset-style tar shards as blocks: a sample is the files of one key (``a/0001.jpg`` and
``a/0001.cls`` are sample ``a/0001``, its columns ``jpg`` and ``cls``), a block ``TAR_BLOCK``
samples in a row. Read with Python's ``tarfile``: an index of each block's byte range (one pass
over the headers, the files' contents skipped), and a block read as its bytes alone.

A batch's columns are the extensions of the shard's first sample, as lists of ``bytes``, plus
``__key__``: decoding (an image, a label) is the person's, in ``transform=``, on the loader's
workers. Only plain ``.tar`` files: a compressed one cannot be read from the middle.
"""

from __future__ import annotations

import io
import tarfile
from typing import Any

TAR = (".tar",)
TAR_BLOCK = 256  # samples of a block
KEY = "__key__"


def _key(name: str) -> tuple[str, str]:
    """A member's sample key and column: everything before the basename's first dot, and
    after it."""
    folder, _, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext


def index(path: str) -> tuple[list[dict], list[str]]:
    """Blocks of ``TAR_BLOCK`` samples (their byte ranges), and the columns of the first sample."""
    starts, rows, columns = [], [], []
    last, count, end = None, 0, 0
    with tarfile.open(path, mode="r:") as tar:
        for member in tar:
            if not member.isfile():
                continue
            key, ext = _key(member.name)
            if key != last:
                if count % TAR_BLOCK == 0:
                    starts.append(member.offset)
                    rows.append(0)
                count, last = count + 1, key
                rows[-1] += 1
            if count == 1:
                columns.append(ext)
            end = member.offset_data + -(-member.size // 512) * 512
    bounds = [*starts, end]
    blocks = [
        {"rows": n, "start": a, "stop": b}
        for n, a, b in zip(rows, bounds[:-1], bounds[1:], strict=True)
    ]
    return blocks, [KEY, *columns]


def read(path: str, start: int, stop: int, rows: int, columns: list[str]) -> Any:
    """The block's samples as a ``pyarrow.Table`` of ``columns`` (bytes; None where a sample has
    no such file)."""
    import pyarrow as pa

    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(stop - start)
    samples: dict[str, dict[str, bytes]] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar:
            if member.isfile():
                key, ext = _key(member.name)
                body = tar.extractfile(member)
                samples.setdefault(key, {})[ext] = body.read() if body else b""
    if len(samples) != rows:
        raise ValueError(f"bytes {start}-{stop} hold {len(samples)} samples, not {rows}")
    out: dict[str, Any] = {KEY: pa.array(list(samples), pa.string())}
    for c in columns[1:]:
        out[c] = pa.array([s.get(c) for s in samples.values()], pa.binary())
    return pa.table(out)
