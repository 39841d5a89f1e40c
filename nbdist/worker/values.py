"""Values on their way to the notebook: pickled here, on the engine, where pickling is sure to work.

Unpickling happens in the notebook's main thread (``notebook.cluster.transfer.unpack``), never
in ipyparallel's I/O thread, where an object that cannot be rebuilt (a DDP model needs a process
group) would break the client.
"""

from __future__ import annotations

from typing import Any

from ..protocol import PackedValue

#: Values larger than this (pickled) come back to the notebook as their repr only.
_MAX_VALUE_BYTES = 64 * 1024 * 1024
#: Characters of a value's repr that travel (its start and its end): it shows in place of a
#: value that cannot be rebuilt in the notebook, and need not be longer than a screen or two.
MAX_REPR_CHARS = 20_000


def portable(value: Any) -> PackedValue:
    """``value`` packed to travel to the notebook: pickled here, where it is sure to work.

    A DDP- or FSDP-wrapped model travels as its inner module; a value that cannot be pickled, or
    is larger than 64 MiB pickled, as its repr only. The repr keeps at most ``MAX_REPR_CHARS``
    characters, its start and its end, with a note of how many were left out.
    """
    import pickle

    value = getattr(value, "module", value) if _is_wrapper(value) else value
    text = _safe_repr(value)
    try:
        try:
            import cloudpickle

            data = cloudpickle.dumps(value)
        except ImportError:
            data = pickle.dumps(value)
    except Exception:
        return PackedValue(repr=text)
    if len(data) > _MAX_VALUE_BYTES:
        return PackedValue(repr=text)
    return PackedValue(repr=text, pickle=data)


def _is_wrapper(value: Any) -> bool:
    return type(value).__name__ in ("DistributedDataParallel", "FullyShardedDataParallel")


def _safe_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception as e:
        text = f"<{type(value).__name__} (repr failed: {e})>"
    if len(text) <= MAX_REPR_CHARS:
        return text
    half = MAX_REPR_CHARS // 2
    return f"{text[:half]} … ({len(text) - 2 * half:,} characters left out) … {text[-half:]}"
