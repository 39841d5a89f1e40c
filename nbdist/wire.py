"""Arrays and tensors on the wire between the kernel and the engines, as raw buffers.

ipyparallel sends numpy arrays without pickling them; a torch tensor travels as a numpy view of
its own memory and is rebuilt by ``torch.from_numpy``. Neither side copies, and the receiver's
array is writable (it lives in the received message's memory). Both sides use this module
(``notebook.data`` to scatter and gather, ``worker.shards`` to hold and export); torch is
imported only when a tensor is packed or rebuilt.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

_NUMPY = "numpy"
_INT_OF_SIZE = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def to_wire(value: Any) -> tuple[np.ndarray, str]:
    """A numpy array sharing ``value``'s memory, and the tag that rebuilds it (``from_wire``).

    Torch tensors are detached and brought to the CPU (a copy only for GPU or non-contiguous
    tensors); dtypes numpy lacks (bfloat16, float8) travel as integers of the same width.
    """
    if isinstance(value, np.ndarray):
        return value, _NUMPY
    import torch

    t = value.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg().contiguous()
    name = str(t.dtype).removeprefix("torch.")
    try:
        return t.numpy(), "torch:" + name
    except TypeError:
        wide = getattr(torch, _INT_OF_SIZE[t.element_size()])
        return t.view(wide).numpy(), "torch:" + name


def from_wire(array: np.ndarray, tag: str) -> Any:
    """Rebuild what ``to_wire`` sent: the numpy array itself, or a tensor on the same memory."""
    if not array.flags.writeable:  # small messages arrive as bytes; large ones in writable frames
        array = array.copy()
    if tag == _NUMPY:
        return array
    import torch

    dtype = getattr(torch, tag.removeprefix("torch:"))
    t = torch.from_numpy(array)
    return t if t.dtype == dtype else t.view(dtype)


def pack(value: Any) -> tuple[list[str], list[np.ndarray], bool]:
    """(tags, arrays, is_tuple) for a value that is an array, a tensor, or a tuple of them."""
    items = list(value) if isinstance(value, tuple) else [value]
    wire = [to_wire(v) for v in items]
    return [t for _, t in wire], [a for a, _ in wire], isinstance(value, tuple)


def unpack(tags: list[str], arrays: tuple, is_tuple: bool) -> Any:
    """Rebuild what ``pack`` sent."""
    items = [from_wire(a, t) for a, t in zip(arrays, tags, strict=True)]
    return tuple(items) if is_tuple else items[0]


def is_array(value: Any) -> bool:
    """A numpy array (not of objects) or a strided torch tensor: what travels as raw buffers."""
    if isinstance(value, np.ndarray):
        return value.dtype != object
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor) and value.layout == torch.strided
