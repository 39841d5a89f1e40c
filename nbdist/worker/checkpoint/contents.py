"""What a checkpoint may hold: tensors and plain values, which a weights-only load rebuilds.

``check_safe`` refuses anything else when it is saved (and already at ``restore``), in one line
naming the object and the fix, not when it would be loaded: a checkpoint that could not be
loaded without running code is never written.

A sharded checkpoint's ``.metadata`` is a pickle (``torch.distributed.checkpoint`` writes it so,
and its own reader would load it with ``pickle.load``): ``load_metadata`` unpickles only the
records DCP's metadata is made of, and refuses any other name in one line, without calling it.
It also refuses metadata that points outside its folder: each item's file must be one DCP
writes, a plain file beside the metadata (not a path, not a link), so a rewritten ``.metadata``
cannot load another checkpoint's tensors.
"""

from __future__ import annotations

import functools
import os
import pickle
import stat
from pathlib import Path
from typing import Any

from ...errors import UsageError


@functools.cache
def _leaf_types() -> frozenset[type]:
    """The exact types a weights-only load rebuilds by default that hold nothing else."""
    import torch

    plain = (str, bytes, bytearray, int, float, complex, bool, type(None))
    return frozenset(
        (*plain, torch.Tensor, torch.nn.Parameter, torch.Size, torch.dtype, torch.device)
    )


def _children(value: Any, leaves: frozenset[type]) -> list[tuple[Any, Any]] | None:
    """The parts of a container a weights-only load rebuilds that are not leaves, as (key or
    index, part), keys included; None when ``value`` is no such container."""
    from collections import OrderedDict

    if type(value) in (dict, OrderedDict):
        keys = [(k, k) for k in value if type(k) not in leaves]
        return keys + [(k, v) for k, v in value.items() if type(v) not in leaves]
    if type(value) in (list, tuple, set):
        return [(i, v) for i, v in enumerate(value) if type(v) not in leaves]
    return None


def _fix(name: str, value: Any) -> str:
    kind = type(value)
    if hasattr(value, "state_dict"):
        return f"pass {name}.state_dict()"
    if kind.__module__ == "numpy" and kind.__name__ == "ndarray":
        return f"pass torch.from_numpy({name}) or {name}.tolist()"
    if kind.__module__ == "numpy":
        return f"pass {name}.item()"
    return "pass its data as tensors and plain values (dicts, lists, numbers, strings)"


def check_safe(name: str, value: Any) -> None:
    """Refuse ``value`` (state ``name``) now if a weights-only load could not rebuild it later:
    one line naming the object and the fix."""
    leaves = _leaf_types()
    todo: list[tuple[tuple, Any]] = [((), value)]
    seen: set[int] = set()
    while todo:
        path, v = todo.pop()
        if type(v) in leaves:
            continue
        parts = _children(v, leaves)
        if parts is not None:
            if id(v) not in seen:  # a container that holds itself is walked once
                seen.add(id(v))
                todo.extend(((*path, k), c) for k, c in parts)
            continue
        where = f"state {name!r}" + (" at " + "".join(f"[{k!r}]" for k in path) if path else "")
        kind = f"{type(v).__module__}.{type(v).__qualname__}"
        raise UsageError(
            f"nbdist.checkpoint: {where} is a {kind}, which a checkpoint cannot hold safely "
            f"(loading it could run code): {_fix(name if not path else 'it', v)}"
        )


@functools.cache
def _metadata_names() -> dict[tuple[str, str], Any]:
    """(module, name) -> object, for every global a DCP metadata pickle may name: its own
    dataclasses and enum, torch.Size, dtypes and layouts (by name), OrderedDict and paths."""
    import collections
    import pathlib

    import torch
    from torch.distributed.checkpoint import filesystem, metadata

    layouts = {str(v): v for v in vars(torch).values() if isinstance(v, torch.layout)}
    names: dict[tuple[str, str], Any] = {
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("torch", "Size"): torch.Size,
        ("torch.serialization", "_get_layout"): layouts.__getitem__,  # str -> layout only
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): filesystem._StorageInfo,
    }
    for name in (*metadata.__all__, "_MEM_FORMAT_ENCODING"):
        names[("torch.distributed.checkpoint.metadata", name)] = getattr(metadata, name)
    for name, value in vars(torch).items():
        if isinstance(value, torch.dtype):
            names[("torch", name)] = value
    for module in ("pathlib", "pathlib._local"):  # where a checkpoint_id path pickles from
        for name in ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"):
            names[(module, name)] = pathlib.PurePosixPath  # a name only: never opened
    return names


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, path: Path) -> None:
        super().__init__(file)
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        found = _metadata_names().get((module, name))
        if found is None:
            raise UsageError(
                f"{self._path} names {module}.{name}, which a checkpoint's metadata never holds: "
                "refused to load it (loading it could run code); delete that checkpoint"
            )
        return found


def load_metadata(path: Path) -> Any:
    """The DCP ``Metadata`` pickled in ``path``, unpickled with only DCP's own records allowed:
    anything else is refused in one line naming the file (a UsageError), and never called."""
    with open(path, "rb") as f:
        try:
            metadata = _MetadataUnpickler(f, path).load()
        except UsageError:
            raise
        except Exception as e:  # a truncated or garbled pickle
            raise UsageError(
                f"{path} is not a checkpoint's metadata ({type(e).__name__}: {e}): delete that "
                "checkpoint"
            ) from None
    storage = getattr(metadata, "storage_data", None)
    for info in storage.values() if isinstance(storage, dict) else ():
        name = getattr(info, "relative_path", None)
        if why := _outside(path.parent, name):
            raise UsageError(
                f"{path} points at {name!r}, {why}: refused to load it (it could load another "
                "checkpoint's data); delete that checkpoint"
            )
    return metadata


def _outside(folder: Path, name: Any) -> str:
    """Why the file ``name`` may lie outside ``folder``; "" when it is a plain name there (no
    path, no NUL) that is no link."""
    if not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in "/\\\0"):
        return "outside its checkpoint folder"
    try:
        link = stat.S_ISLNK(os.lstat(folder / name).st_mode)
    except FileNotFoundError:
        return ""  # missing: DCP says so when it reads it
    except OSError as e:
        return f"which cannot be checked ({e.strerror})"
    return "a link, which may lead outside its checkpoint folder" if link else ""
