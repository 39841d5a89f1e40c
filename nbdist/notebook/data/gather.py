"""Bring per-rank arrays back into the notebook: ``nbdist.gather``.

The ranks' rows are joined in rank order; for a name sent by ``scatter`` (or a result that follows
a scattered name's rows, ``like=``) the shuffle is undone, so per-sample results line up with the
notebook's rows. Checked before anything large moves (``checks``: every rank's shapes and dtypes
join; the notebook has the memory for the result).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ... import wire
from ...errors import UsageError
from ...worker import api
from .. import session
from ..cluster import fanout
from . import checks, scatter
from .sharding import restore_order

if TYPE_CHECKING:
    from ..cluster.ranks import Ranks


def gather(name: str, *, like: str | None = None, ordered: bool = True) -> Any:
    """Bring the per-rank array or tensor ``name`` (or a tuple of them) into the notebook.

    The ranks' rows are joined in rank order; for a name sent by ``scatter`` they come back in
    the data set's own order (shuffle undone, repeated rows left out). ``like`` names the
    scattered data set whose order a per-rank result follows (predictions made from it, say);
    ``ordered=False`` keeps rank order. Per-rank single values (0-d) come back stacked.
    """
    checks.check_name(name)
    if like is not None:
        checks.check_name(like, "like")
    cluster = session.current()
    described = fanout.on_ranks(cluster, api.describe, name, timeout=scatter.CALL_TIMEOUT)
    described.check("describe on the engines", error=UsageError)
    descs = described.ordered()
    checks.check_joinable(name, descs)
    record = _order_of(cluster, name, like, descs) if ordered else None
    total = sum(d.nbytes for d in descs)
    checks.check_local(2 * total, f"gather of {name!r}")
    wait = scatter.SEND_TIMEOUT + total / scatter.SLOWEST_RATE
    exported = fanout.on_ranks(cluster, api.export, name, timeout=wait)
    exported.check("export on the engines", error=UsageError)
    answers = exported.ordered()
    tags, _, is_tuple = answers[0]
    out = []
    for i, tag in enumerate(tags):
        parts = [a[1][i] for a in answers]
        if parts[0].ndim == 0:
            joined = np.stack(parts)
        elif record is not None:
            joined = restore_order(parts, record.shards)
        else:
            joined = np.concatenate(parts)
        out.append(wire.from_wire(joined, tag))
    return tuple(out) if is_tuple else out[0]


def _order_of(
    cluster: Ranks, name: str, like: str | None, descs: list[dict]
) -> scatter.Scattered | None:
    """The scatter whose order ``name``'s rows follow, checked against the ranks' row counts."""
    key = like or name
    record = scatter.scattered(key)
    if record is not None and record.engine_ids != tuple(s.engine_id for s in cluster.slots):
        record = None  # scattered to engines that are gone
    if record is None:
        if like is not None:
            raise UsageError(
                f"{like!r} was not scattered to the ranks of this cluster: scatter "
                "it first, or leave like= out to join the ranks' rows in rank order"
            )
        return None
    for r, d in enumerate(descs):
        for shape in d.shapes:
            if shape and shape[0] != record.shards[r].size:
                raise UsageError(
                    f"{name!r} has {shape[0]} rows on rank {r} but {key!r} was scattered with "
                    f"{record.shards[r].size} there, so its order cannot be restored: pass "
                    "ordered=False for rank order"
                )
    return record
