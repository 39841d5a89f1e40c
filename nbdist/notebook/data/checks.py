"""What ``scatter`` and ``gather`` check before a byte moves, each failure one clear line.

Names, options, types and lengths of the data, its labels, the memory a transfer would take on
each host, and whether the ranks' values can be joined. These functions make no engine calls:
``nbdist.notebook.data.scatter`` asks the engines and passes their answers in.
"""

from __future__ import annotations

import keyword
import socket
from typing import Any, get_args

import numpy as np

from ... import wire
from ...errors import UsageError
from ...protocol import ValueInfo
from ..cluster.fanout import targets_text
from .sharding import Remainder, human_bytes

MEMORY_SHARE = 0.9  # a transfer may fill at most this share of a host's available memory


def check_name(name: Any, what: str = "name") -> None:
    """Refuse a name that cannot be a variable on the engines (or that hides ``nbdist``)."""
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise UsageError(
            f"{what} {name!r} is not a valid variable name: use letters, digits and _, "
            "not starting with a digit"
        )
    if name == "nbdist":
        raise UsageError("'nbdist' is the nbdist module on the engines: choose another name")


def check_options(remainder: Any, seed: Any) -> None:
    """Refuse a ``remainder`` or ``seed`` that ``scatter`` does not know."""
    if remainder not in get_args(Remainder):
        raise UsageError(f"remainder must be 'drop', 'pad' or 'uneven', not {remainder!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise UsageError(f"seed must be a whole number >= 0, not {seed!r}")


def arrays_of(data: Any) -> tuple[list[str], list[np.ndarray], bool]:
    """(tags, arrays, is_tuple): ``data`` as numpy arrays sharing its memory, or a clear error."""
    items = list(data) if isinstance(data, tuple) else [data]
    if not items:
        raise UsageError("scatter got an empty tuple: pass an array, a tensor or a tuple of them")
    for i, item in enumerate(items):
        where = f"element {i} of the tuple" if isinstance(data, tuple) else "the data"
        if isinstance(item, np.ndarray) and item.dtype == object:
            raise UsageError(
                f"{where} has dtype object, which cannot travel as a raw buffer: "
                "convert it to a numeric or string dtype"
            )
        if not wire.is_array(item):
            raise UsageError(
                f"scatter sends numpy arrays and torch tensors (or a tuple of them, aligned by "
                f"rows), but {where} is a {type(item).__name__}: convert it, e.g. np.asarray(x)"
            )
        if item.ndim == 0:
            raise UsageError(f"{where} is a single value (0-d): scatter splits rows of an array")
    tags, arrays, is_tuple = wire.pack(data)
    lengths = [len(a) for a in arrays]
    if len(set(lengths)) > 1:
        raise UsageError(
            f"the arrays of the tuple have different lengths {lengths}: features and labels "
            "need one row per sample"
        )
    return tags, arrays, is_tuple


def labels_of(labels: Any, n: int, what: str) -> np.ndarray:
    """``labels`` as a 1-D numpy array of length ``n``, one class per distinct value; ``what``
    names the argument. Floats are taken only when every value is a whole number (labels read
    from a file often arrive as 0.0, 1.0, ...): any other float would be a class of its own."""
    if isinstance(labels, np.ndarray) and labels.dtype == object:
        raise UsageError(
            f"{what} has dtype object: convert it to integers or strings, e.g. y.astype(int)"
        )
    if not wire.is_array(labels):
        raise UsageError(
            f"{what} must be a 1-D numpy array or torch tensor of labels, not "
            f"{type(labels).__name__}"
        )
    arr, tag = wire.to_wire(labels)
    if tag.startswith("torch:") and tag.removeprefix("torch:") != str(arr.dtype):
        raise UsageError(f"{what} has dtype {tag[6:]}: convert it, e.g. y.long()")
    if arr.ndim != 1:
        raise UsageError(
            f"{what} needs one label per row (a 1-D array), not shape "
            f"{tuple(arr.shape)}: for one-hot labels pass labels.argmax(1)"
        )
    if len(arr) != n:
        raise UsageError(
            f"{what} has {len(arr)} labels but the data has {n} rows: they must "
            "be aligned, one label per row"
        )
    if arr.dtype.kind == "c":
        raise UsageError(f"{what} has complex labels: labels are integers, strings or booleans")
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr)
        if bad.any():
            raise UsageError(
                f"{what} has a NaN or infinite label (row {int(np.argmax(bad))}): drop or fill "
                "those rows first"
            )
        frac = arr != np.floor(arr)
        if frac.any():
            raise UsageError(
                f"{what} has labels that are not whole numbers (such as {arr[frac][0]:g}): each "
                "value would be a class of its own; bin them first, e.g. np.digitize(y, bins)"
            )
    return arr


def check_memory(
    free: list[tuple[str, int]], per_rank: list[int], local: int, what: str, fix: str
) -> None:
    """Refuse, with the figures, when a host has less available memory than it would need.

    ``free`` is each rank's (host, bytes available), in rank order; a host needs its ranks'
    ``per_rank`` bytes, plus ``local`` bytes of copies in the notebook on the notebook's host.
    """
    import psutil

    need: dict[str, int] = {}
    avail: dict[str, int] = {}
    ranks: dict[str, list[int]] = {}
    for r, (host, available) in enumerate(free):
        need[host] = need.get(host, 0) + per_rank[r]
        avail[host] = min(avail.get(host, available), available)
        ranks.setdefault(host, []).append(r)
    who = {host: [targets_text(rs)] for host, rs in ranks.items()}
    if local:
        here = socket.gethostname()
        need[here] = need.get(here, 0) + local
        avail[here] = min(avail.get(here, 1 << 62), psutil.virtual_memory().available)
        who.setdefault(here, []).append("the notebook")
    for host, needed in need.items():
        if needed > MEMORY_SHARE * avail[host]:
            raise UsageError(
                f"{what} needs {human_bytes(needed)} of memory on {host} "
                f"({' and '.join(who[host])}) but only {human_bytes(avail[host])} is available "
                f"there: {fix}"
            )


def check_local(nbytes: int, what: str) -> None:
    """Refuse when the notebook's host has too little available memory for ``nbytes``."""
    import psutil

    avail = psutil.virtual_memory().available
    if nbytes > MEMORY_SHARE * avail:
        raise UsageError(
            f"{what} needs {human_bytes(nbytes)} of memory in the notebook but only "
            f"{human_bytes(avail)} is available: gather less (a slice per rank)"
        )


def check_joinable(name: str, descs: list[ValueInfo | None]) -> None:
    """Refuse unless every rank holds arrays (or tuples of them) whose rows can be joined;
    ``descs`` are the ranks' answers to ``nbdist.worker.api.describe``, in rank order."""
    missing = [r for r, d in enumerate(descs) if d is None]
    if missing:
        raise UsageError(
            f"{name!r} is not defined on {targets_text(missing)}: define it "
            "in a %%distributed cell first"
        )
    for r, d in enumerate(descs):
        if not d.ok:
            raise UsageError(
                f"gather brings back numpy arrays and torch tensors (or tuples of them), but "
                f"{name!r} on rank {r} is a {d.type}: bring it with nbdist.pull({name!r}, {r})"
            )
    first = descs[0]
    for r, d in enumerate(descs):
        if (d.is_tuple, len(d.shapes)) != (first.is_tuple, len(first.shapes)):
            raise UsageError(
                f"{name!r} is a {first.type} on rank 0 but a {d.type} on "
                f"rank {r}: every rank must hold the same kind of value"
            )
        for i, (shape, dtype) in enumerate(zip(d.shapes, d.dtypes, strict=True)):
            shape0, dtype0 = first.shapes[i], first.dtypes[i]
            if dtype != dtype0 or shape[1:] != shape0[1:] or (len(shape) == 0) != (not shape0):
                raise UsageError(
                    f"{name!r} has dtype {dtype0} and shape {shape0} on rank 0 but {dtype} and "
                    f"{shape} on rank {r}: the ranks' rows must match to be joined"
                )
