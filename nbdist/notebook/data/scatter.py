"""Send a notebook data set to the ranks, one representative shard each: ``nbdist.scatter``.

Scatter checks everything it can before a byte is sent (``checks``: types, lengths, names, the
engines' free memory), plans the shards (``sharding.plan``), then sends each rank its rows as raw
buffers (contiguous rows go as views of the notebook's memory, without a copy) and commits the
name on every rank only once every rank holds its shard (see ``nbdist.worker.shards``). A
failure leaves nothing behind on any rank. It prints a ``sharding.ShardReport``, and keeps the
plan of each scattered name (one integer per row) for ``gather``, which undoes the shuffle.

Every request to the engines is a function of ``nbdist.worker.api``, sent through ``fanout``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import UsageError
from ...protocol import ShardMeta
from ...worker import api
from .. import session
from ..cluster import fanout
from . import checks
from .sharding import Remainder, Shard, ShardReport, plan, shard_sizes

if TYPE_CHECKING:
    from ..cluster.ranks import Ranks

CALL_TIMEOUT = 30.0  # seconds for an engine to answer a small request
SEND_TIMEOUT = 60.0  # seconds for a send, plus one second per SLOWEST_RATE bytes
SLOWEST_RATE = 20e6


@dataclass
class Scattered:
    """What the kernel remembers of a scatter, for ``gather``: the engines it went to (in rank
    order) and each rank's shard."""

    engine_ids: tuple[int, ...]
    shards: list[Shard]


_scattered: dict[str, Scattered] = {}


def scattered(name: str) -> Scattered | None:
    """What the latest scatter to ``name`` sent, or None."""
    return _scattered.get(name)


def targets(cluster: Ranks) -> dict[int, int]:
    """Rank -> engine id: where ``fanout`` sends."""
    return {s.rank: s.engine_id for s in cluster.slots}


# -- scatter --------------------------------------------------------------------------------------
def scatter(
    name: str,
    data: Any,
    *,
    shuffle: bool = True,
    seed: int = 0,
    stratify: Any = None,
    labels: Any = None,
    remainder: Remainder = "uneven",
) -> ShardReport:
    """Send one shard of ``data`` to each rank, where it is defined as ``name``; print a report.

    ``data`` is a numpy array, a torch tensor, or a tuple of them aligned by rows (features
    and labels). Rows are shuffled (from ``seed``) before they are split, unless ``shuffle`` is
    False. ``stratify=labels`` keeps every shard's label shares within one sample per class of
    the whole; ``labels`` alone only adds the label histogram to the report. ``remainder`` says
    what to do when the rows do not divide evenly: ``"uneven"`` (some ranks get one row more),
    ``"drop"`` (leave the extra rows out) or ``"pad"`` (repeat rows). ``nbdist.loader(name)``
    batches a shard on the engines; ``gather(name)`` brings it back in the original order.
    Recovery sends it again to fresh engines while the notebook still holds the data (it is
    held weakly: ``del X`` frees it); a later scatter to the same ``name`` replaces it.
    """
    t0 = time.perf_counter()
    checks.check_name(name)
    checks.check_options(remainder, seed)
    tags, arrays, is_tuple = checks.arrays_of(data)
    n = len(arrays[0])
    strat = checks.labels_of(stratify, n, "stratify") if stratify is not None else None
    shown = strat
    if shown is None and labels is not None:
        shown = checks.labels_of(labels, n, "labels")
    cluster = session.current()
    world = len(cluster.slots)
    if n < world:
        raise UsageError(
            f"the data has {n} rows but there are {world} ranks: each rank needs at "
            "least one (send more rows, or use fewer ranks)"
        )
    sizes = shard_sizes(n, world, remainder)
    row_bytes = sum(a.nbytes // n for a in arrays)
    copies = shuffle or strat is not None or remainder == "pad"
    free = fanout.on_ranks(cluster, api.free_memory, timeout=CALL_TIMEOUT)  # a lost rank: here
    free.check("free_memory on the engines", error=UsageError)
    checks.check_memory(
        free.ordered(),
        [s * row_bytes for s in sizes],
        n * row_bytes if copies else 0,
        f"scatter of {name!r}",
        "send less data (fewer rows or a smaller dtype)"
        + (", or shuffle=False to send without a copy" if copies else ""),
    )
    shards = plan(n, world, shuffle=shuffle, seed=int(seed), labels=strat, remainder=remainder)
    pads = tuple(len(s.pad) for s in shards)
    meta = ShardMeta(
        name=name,
        rank=0,  # each rank's own is set as it is sent
        world_size=world,
        sizes=tuple(sizes),
        pads=pads,
        total=n,
        seed=int(seed),
        shuffle=shuffle,
        stratified=strat is not None,
        remainder=remainder,
    )
    _send(cluster, meta, tags, arrays, is_tuple, shards)
    _scattered[name] = Scattered(tuple(s.engine_id for s in cluster.slots), shards)
    options = {"shuffle": shuffle, "seed": seed, "remainder": remainder}
    redo = _Rescatter(name, {"data": data, "stratify": stratify, "labels": labels}, options)
    cluster.journal.record(
        redo, key=name
    )  # a later scatter to the same name takes this one's place
    how = ", ".join(
        [f"shuffled with seed {seed}" if shuffle else "in order"]
        + (["stratified"] if strat is not None else [])
        + [f"remainder {remainder}"]
    )
    seconds = time.perf_counter() - t0
    report = ShardReport(name, sizes, list(pads), n, row_bytes * n, seconds, how)
    if shown is not None:
        report.add_labels(shown, shards)
    report.show()
    return report


class _Rescatter:
    """Recovery's way to send a scatter again to fresh engines, re-sharded to their number.

    The notebook's arrays are held weakly (``_weakly``), so ``del X`` in the notebook frees
    them; recovery then says, in one line, that the data is gone instead of keeping it alive."""

    def __init__(self, name: str, values: dict[str, Any], options: dict[str, Any]):
        self.name, self.options = name, options
        self.held = {k: _weakly(v) for k, v in values.items() if v is not None}

    def __call__(self) -> str | None:
        values = {k: get() for k, get in self.held.items()}
        if any(v is None for v in values.values()):
            return (
                f"nbdist: the data scattered as {self.name!r} was deleted in the notebook (or "
                f"was a temporary copy): the fresh engines have no {self.name}; scatter it again"
            )
        scatter(self.name, values.pop("data"), **values, **self.options)
        return None


def _weakly(value: Any) -> Callable[[], Any]:
    """A callable giving ``value`` (an array, a tensor, or a tuple of them) back while the
    notebook holds it, else None. A numpy view is rebuilt from the array it views, so a
    scatter of ``X[:1000]`` is redone while ``X`` lives, and ``del X`` still frees ``X``."""
    if isinstance(value, tuple):
        parts = [_weakly(v) for v in value]

        def members() -> tuple | None:
            got = tuple(p() for p in parts)
            return None if any(g is None for g in got) else got

        return members
    if isinstance(value, np.ndarray) and isinstance(value.base, np.ndarray):
        root = value.base
        while isinstance(root.base, np.ndarray):
            root = root.base
        ref = weakref.ref(root)
        offset = value.__array_interface__["data"][0] - root.__array_interface__["data"][0]
        shape, dtype, strides = value.shape, value.dtype, value.strides

        def view() -> np.ndarray | None:
            r = ref()
            return None if r is None else np.ndarray(shape, dtype, r, offset, strides)

        with contextlib.suppress(TypeError, ValueError, BufferError):
            if view() is not None:
                return view
    try:
        return weakref.ref(value)
    except TypeError:  # a type that cannot be held weakly: held as it is
        return lambda: value


def _send(
    cluster: Ranks,
    meta: ShardMeta,
    tags: list[str],
    arrays: list[np.ndarray],
    is_tuple: bool,
    shards: list[Shard],
) -> None:
    """Send every rank its shard under a private token, then commit the name everywhere; on any
    failure (or an interrupt) drop the token on every rank, so that nothing is left half-sent."""
    what = f"scatter of {meta.name!r}"
    token = f"{meta.name}-{uuid.uuid4().hex}"
    client, where = cluster.client, targets(cluster)
    nbytes = sum(s.size for s in shards) * sum(a.nbytes // len(a) for a in arrays)
    pending: dict[int, Any] = {}
    try:
        for (rank, eid), shard in zip(where.items(), shards, strict=True):
            mine = dataclasses.replace(meta, rank=rank)
            parts = [shard.take(a) for a in arrays]
            pending |= fanout.submit(
                client, {rank: eid}, api.receive, token, mine, tags, is_tuple, *parts
            )
            del parts  # the message holds them until sent; then a copy's memory is freed
        sent = fanout.wait(pending, SEND_TIMEOUT + nbytes / SLOWEST_RATE, client)
        if sent.failures:
            raise UsageError(
                f"{what} failed on {fanout.describe_failures(sent.failures)}; "
                "nothing was kept on any rank"
            )
        committed = fanout.call(client, where, api.commit, token, meta.name, timeout=CALL_TIMEOUT)
        committed.check(what, error=UsageError)
    except BaseException:
        for rank, eid in where.items():  # best effort: a dead rank has nothing left to drop
            with contextlib.suppress(Exception):
                fanout.submit(client, {rank: eid}, api.discard, token)
        raise


def scatter_variable(
    ns: dict,
    var: str,
    *,
    target: str | None = None,
    stratify: str | None = None,
    labels: str | None = None,
    **options: Any,
) -> ShardReport:
    """``%nbdist scatter VAR``: scatter notebook variables, named, to ``target`` (default VAR)."""

    def value(v: str) -> Any:
        if v not in ns:
            raise UsageError(f"{v!r} is not defined in the notebook")
        return ns[v]

    return scatter(
        target or var,
        value(var),
        stratify=value(stratify) if stratify else None,
        labels=value(labels) if labels else None,
        **options,
    )
