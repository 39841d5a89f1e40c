"""A block's rows as a batch: a dict of column name to tensor, as torch's default collate makes
of dict samples. Numbers and booleans become 1-D tensors, lists of numbers of one length (an
embedding, an image's pixels) 2-D or more; text and what has no tensor form stays a list of
Python values, as collate leaves strings. Lists of uneven length (token ids) come as a list of
1-D tensors where collate would fail: pad them in ``transform=``. A missing float is NaN; a
missing integer or boolean has no tensor form and is named in one line."""

from __future__ import annotations

from typing import Any

import numpy as np


def batch(table: Any) -> dict[str, Any]:
    """``table`` (a ``pyarrow.Table``) as a dict of column name to tensor or list."""
    table = table.combine_chunks()
    return {name: _column(name, table.column(name)) for name in table.column_names}


def _column(name: str, column: Any) -> Any:
    import pyarrow.compute as pc
    import pyarrow.types as t
    import torch

    from ...errors import UsageError

    array = column.chunk(0) if column.num_chunks else column
    if array.null_count and t.is_floating(array.type):
        array = pc.fill_null(array, float("nan"))
    elif array.null_count and (t.is_integer(array.type) or t.is_boolean(array.type)):
        raise UsageError(
            f"nbdist.loader: column {name!r} has missing values, which integers and booleans "
            "cannot hold in a tensor: fill them in the files, or store the column as floats"
        )
    values = _numbers(array)
    if values is not None:
        return torch.from_numpy(values)
    if t.is_list(array.type) or t.is_large_list(array.type):
        parts = (_numbers(array[i].values) for i in range(len(array)))
        rows = [torch.from_numpy(p) if p is not None else None for p in parts]
        if all(r is not None for r in rows):
            return rows
    return array.to_pylist()


def _numbers(array: Any) -> np.ndarray | None:
    """The array as numbers of one shape, or None (text, nulls, ragged lists)."""
    import pyarrow as pa
    import pyarrow.types as t

    if array.null_count:
        return None
    kind = array.type
    if t.is_integer(kind) or t.is_floating(kind) or t.is_boolean(kind):
        out = array.to_numpy(zero_copy_only=False)
        return out.copy() if not out.flags.writeable else out
    if t.is_fixed_size_list(kind) or t.is_list(kind) or t.is_large_list(kind):
        n = len(array)
        if t.is_fixed_size_list(kind):
            width = kind.list_size
        else:
            lengths = pa.compute.list_value_length(array).to_numpy(zero_copy_only=False)
            if n and (lengths != lengths[0]).any():
                return None
            width = int(lengths[0]) if n else 0
        inner = _numbers(array.flatten())
        return None if inner is None else inner.reshape(n, width, *inner.shape[1:])
    return None


def to_device(batch: Any, device: Any) -> Any:
    """A collated batch (tensors, possibly in tuples, lists or dicts) moved to ``device``."""
    if hasattr(batch, "to"):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch
