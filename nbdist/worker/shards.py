"""Shards on an engine: what ``nbdist.scatter`` sent to this rank (``nbdist.loader`` reads
them: ``data.indexed``).

A scatter lands in two steps, so that a failed one leaves nothing behind: each rank first holds
its shard under a private token (``hold``); only once every rank has its shard does the
notebook make the name visible on all of them (``commit``), and otherwise it asks every rank to
drop the token. Arrays travel as raw buffers (``nbdist.wire``).
"""

from __future__ import annotations

import numpy as np

from .. import wire
from ..protocol import ShardMeta, ValueInfo
from .state import engine, namespace


# -- the engine's half of a scatter (called through nbdist.worker.api) -----------------------------
def hold(token: str, meta: ShardMeta, tags: list[str], is_tuple: bool, arrays: tuple) -> int:
    """Hold this rank's shard under ``token`` until the notebook commits it; return its bytes."""
    engine.pending_shards[token] = (wire.unpack(tags, arrays, is_tuple), meta)
    return sum(a.nbytes for a in arrays)


def commit(token: str, name: str) -> None:
    """Make the shard held under ``token`` visible as ``name`` in the user's namespace."""
    value, meta = engine.pending_shards.pop(token)
    namespace()[name] = value
    engine.shards[name] = meta


def describe(name: str) -> ValueInfo | None:
    """What ``gather`` needs to know before it asks for ``name``: None when undefined here."""
    ns = namespace()
    if name not in ns:
        return None
    value = ns[name]
    items = list(value) if isinstance(value, tuple) else [value]
    ok = bool(items) and all(wire.is_array(v) for v in items)
    kind, is_tuple = type(value).__name__, isinstance(value, tuple)
    if not ok:
        return ValueInfo(type=kind, ok=False, is_tuple=is_tuple)
    return ValueInfo(
        type=kind,
        ok=True,
        is_tuple=is_tuple,
        shapes=tuple(tuple(v.shape) for v in items),
        dtypes=tuple(str(v.dtype) for v in items),
        nbytes=sum(
            v.nbytes if isinstance(v, np.ndarray) else v.numel() * v.element_size() for v in items
        ),
    )
