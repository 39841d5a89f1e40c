"""Values from engines, unpacked in the notebook's main thread (see ``worker.values.portable``).

The pickle was made by this cluster's own engine and came over ipyparallel's signed channel.
Tensors are rebuilt on the CPU: a value that lived on an engine's GPU arrives in a notebook
that may have no GPU at all (and the kernel never needs one).
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from ...protocol import PackedValue


class EngineValue:
    """Stands in for an engine value that could not travel: shows its repr, as plain text."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _storage_on_cpu(data: bytes) -> Any:
    """``torch.storage._load_from_bytes``, mapped to the CPU (torch pickles each tensor's storage
    as a small ``torch.save`` payload that names the device it was on)."""
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "torch.storage" and name == "_load_from_bytes":
            return _storage_on_cpu
        return super().find_class(module, name)


def unpack(packed: PackedValue | None) -> Any:
    """The value itself where it can be rebuilt here, else an ``EngineValue`` with its repr."""
    if packed is None:
        return None
    if packed.pickle is not None:
        try:
            return _Unpickler(io.BytesIO(packed.pickle)).load()
        except Exception:
            pass
    return EngineValue(packed.repr)
