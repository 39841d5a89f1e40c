"""Send a notebook data set to the ranks, one representative shard each, and bring results back.

- **The plan** (which rows go to which rank) is a pure function of the data set's length, its
  labels and the options: ``plan()``, with ``shard_sizes()`` and ``restore_order()`` its
  companions. Shuffling uses one permutation drawn from ``seed``; stratifying deals each class's
  rows round-robin, so every shard holds each class within one sample of its share.
- **Scatter** checks everything it can before a byte is sent (types, lengths, names, the engines'
  free memory), then sends each rank its rows as raw buffers (contiguous rows go as views of the
  notebook's memory, without a copy) and commits the name on every rank only once every rank
  holds its shard (see ``nbdist.worker.shards``). A failure leaves nothing behind on any rank.
- **The report** printed after a scatter: rows and label histogram per rank, and a warning for
  any shard whose labels differ markedly from the whole.
- **Gather** brings per-rank arrays back; for a scattered name it undoes the shuffle, so that
  per-sample results line up with the notebook's rows.

The plan of each scattered name stays in the kernel (one integer per row), for ``gather``.
"""

from __future__ import annotations

import functools
import keyword
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ..errors import UsageError
from ..worker import shards as engine
from . import session

Remainder = Literal["drop", "pad", "uneven"]
_REMAINDERS = ("drop", "pad", "uneven")
_MEMORY_SHARE = 0.9  # a scatter may fill at most this share of a host's available memory
_CALL_TIMEOUT = 30.0  # seconds for an engine to answer a small request
_SEND_TIMEOUT = 60.0  # seconds for a send, plus one second per _SLOWEST_RATE bytes
_SLOWEST_RATE = 20e6
_WARN_SHARE = 0.10  # a shard whose label share differs from the whole's by more than this warns
_SHOWN_CLASSES = 10


# -- the plan: pure functions ---------------------------------------------------------------------
@dataclass(frozen=True)
class Shard:
    """The data set's rows one rank gets: ``rows`` (a slice when contiguous), then ``pad``,
    some of those rows repeated so that every rank has as many (``remainder="pad"``)."""

    rows: slice | np.ndarray
    pad: np.ndarray

    @property
    def kept(self) -> int:
        """Rows of the data set on this rank, repeats not counted."""
        return len(self.row_indices()) if not isinstance(self.rows, slice) else (
            self.rows.stop - self.rows.start
        )

    @property
    def size(self) -> int:
        """Rows on this rank, repeats included."""
        return self.kept + len(self.pad)

    def row_indices(self) -> np.ndarray:
        """``rows`` as an index array."""
        if isinstance(self.rows, slice):
            return np.arange(self.rows.start, self.rows.stop)
        return self.rows

    def indices(self) -> np.ndarray:
        """Every row this rank gets, in the order it gets them."""
        if not len(self.pad):
            return self.row_indices()
        return np.concatenate([self.row_indices(), self.pad])


def shard_sizes(n: int, world: int, remainder: Remainder = "uneven") -> list[int]:
    """Rows on each rank: ``drop`` cuts the data set to a multiple of ``world``, ``pad`` repeats
    rows up to the next multiple, ``uneven`` gives the first ``n % world`` ranks one row more."""
    base, extra = divmod(n, world)
    if remainder == "drop":
        return [base] * world
    if remainder == "pad":
        return [base + (extra > 0)] * world
    return [base + (r < extra) for r in range(world)]


def plan(
    n: int,
    world: int,
    *,
    shuffle: bool = True,
    seed: int = 0,
    labels: np.ndarray | None = None,
    remainder: Remainder = "uneven",
) -> list[Shard]:
    """Which of ``n`` rows each of ``world`` ranks gets.

    Without labels, rank r gets the r-th contiguous block of one permutation of the rows (of
    the rows themselves when ``shuffle`` is off: then shards are slices and travel uncopied).
    With ``labels``, the rows, grouped by class, are dealt round-robin, so each shard holds
    each class's rows within one of ``count / world``. Shuffled shards are in random order.
    """
    rng = np.random.default_rng(seed)
    kept_n = (n // world) * world if remainder == "drop" else n
    kept_sizes = shard_sizes(kept_n, world, "uneven")
    if labels is None:
        order = rng.permutation(n)[:kept_n] if shuffle else None
        bounds = np.concatenate([[0], np.cumsum(kept_sizes)])
        rows = [
            slice(int(a), int(b)) if order is None else order[a:b]
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        ]
    else:
        _, codes = np.unique(np.asarray(labels), return_inverse=True)
        codes = codes.reshape(-1)
        perm = rng.permutation(n) if shuffle else np.arange(n)
        class_order = rng.permutation(codes.max() + 1) if shuffle else np.arange(codes.max() + 1)
        grouped = perm[np.argsort(class_order[codes[perm]], kind="stable")][:kept_n]
        rows = [grouped[r::world] for r in range(world)]
        rows = [rng.permutation(r) if shuffle else np.sort(r) for r in rows]
    target = shard_sizes(n, world, remainder)
    out = []
    for r, part in enumerate(rows):
        shard = Shard(part, np.empty(0, dtype=np.int64))
        need = target[r] - shard.kept
        out.append(Shard(part, np.resize(shard.row_indices(), need)) if need > 0 else shard)
    return out


def restore_order(parts: list[np.ndarray], shards: list[Shard]) -> np.ndarray:
    """The inverse of a scatter: per-rank rows (one per row sent) back in the data set's order,
    repeats left out. Rows a ``drop`` left out are missing; the others keep their order."""
    kept = [p[: s.kept] for p, s in zip(parts, shards, strict=True)]
    if any(isinstance(s.rows, np.ndarray) for s in shards):
        sent = np.sort(np.concatenate([s.row_indices() for s in shards]))
        if len(sent) and sent[-1] == len(sent) - 1:  # every row was sent: positions are indices
            positions = [s.rows for s in shards]
        else:
            positions = [np.searchsorted(sent, s.rows) for s in shards]
    else:
        positions = [s.rows for s in shards]  # contiguous blocks from row 0, in rank order
    out = np.empty((sum(s.kept for s in shards),) + parts[0].shape[1:], dtype=parts[0].dtype)
    for pos, rows in zip(positions, kept, strict=True):
        out[pos] = rows
    return out


def label_counts(codes: np.ndarray, shards: list[Shard], classes: int) -> np.ndarray:
    """Rows of each class on each rank (ranks x classes), repeats included."""
    return np.stack([np.bincount(codes[s.indices()], minlength=classes) for s in shards])


def label_warnings(names: list[str], counts: np.ndarray, overall: np.ndarray) -> list[str]:
    """One line per rank whose label shares differ markedly from the whole data set's: by more
    than ``_WARN_SHARE`` and by more than two rows (a stratified shard never does)."""
    share = overall / overall.sum()
    out = []
    for r, row in enumerate(counts):
        size = row.sum()
        gap = row - share * size
        worst = int(np.argmax(np.abs(gap)))
        if abs(gap[worst]) > 2 and abs(gap[worst]) / size > _WARN_SHARE:
            out.append(
                f"warning: rank {r}'s shard is not representative: label {names[worst]} is "
                f"{100 * row[worst] / size:.1f} % of it but {100 * share[worst]:.1f} % of the "
                "whole; scatter with stratify=labels"
            )
    return out


# -- the report -----------------------------------------------------------------------------------
@dataclass
class ShardReport:
    """What a scatter sent: rows (and labels) per rank, and warnings about the shards."""

    name: str
    sizes: list[int]
    pads: list[int]
    total: int
    nbytes: int
    seconds: float
    how: str
    classes: list[str] = field(default_factory=list)
    counts: np.ndarray | None = None  # ranks x classes
    overall: np.ndarray | None = None
    warnings: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        head = (
            f"nbdist: {self.name!r} scattered to {len(self.sizes)} ranks in {self.seconds:.2f} s "
            f"({self.total:,} rows, {_human(self.nbytes)}; {self.how})"
        )
        cols = ["rank", "rows"] + (["repeated"] if any(self.pads) else [])
        rows = [[str(r), f"{s:,}"] + ([str(p)] if any(self.pads) else [])
                for r, (s, p) in enumerate(zip(self.sizes, self.pads, strict=True))]
        total = ["all", f"{self.total:,}"] + ([""] if any(self.pads) else [])
        notes = []
        if self.counts is not None:
            shown = np.argsort(-self.overall, kind="stable")[:_SHOWN_CLASSES]
            cols += [f"label {self.classes[c]}" for c in shown]
            for r, row in enumerate(rows):
                row += [str(self.counts[r, c]) for c in shown]
            total += [str(self.overall[c]) for c in shown]
            if len(self.classes) > len(shown):
                notes.append(f"(the {len(shown)} most common of {len(self.classes)} labels)")
        table = rows + [total]
        widths = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(cols)]
        lines = [head, "  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True))]
        lines += ["  ".join(v.rjust(w) for v, w in zip(t, widths, strict=True)) for t in table]
        return "\n".join(lines + notes + self.warnings)

    def __repr__(self) -> str:
        return f"<ShardReport {self.name!r}: rows {'/'.join(map(str, self.sizes))}>"


def _human(nbytes: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if nbytes < 1000 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "bytes" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    return ""


# -- checks before anything is sent ---------------------------------------------------------------
def _check_name(name: Any, what: str = "name") -> None:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise UsageError(
            f"{what} {name!r} is not a valid variable name: use letters, digits and _, "
            "not starting with a digit"
        )
    if name == "nbdist":
        raise UsageError("'nbdist' is the nbdist module on the engines: choose another name")


def _arrays_of(data: Any) -> tuple[list[str], list[np.ndarray], bool]:
    """(tags, arrays, is_tuple): ``data`` as numpy arrays sharing its memory, or a clear error."""
    items = list(data) if isinstance(data, tuple) else [data]
    if not items:
        raise UsageError("scatter got an empty tuple: pass an array, a tensor or a tuple of them")
    for i, item in enumerate(items):
        where = f"element {i} of the tuple" if isinstance(data, tuple) else "the data"
        if isinstance(item, np.ndarray) and item.dtype == object:
            raise UsageError(f"{where} has dtype object, which cannot travel as a raw buffer: "
                             "convert it to a numeric or string dtype")
        if not engine._is_array(item):
            raise UsageError(
                f"scatter sends numpy arrays and torch tensors (or a tuple of them, aligned by "
                f"rows), but {where} is a {type(item).__name__}: convert it, e.g. np.asarray(x)"
            )
        if item.ndim == 0:
            raise UsageError(f"{where} is a single value (0-d): scatter splits rows of an array")
    wire = [engine.to_wire(v) for v in items]
    lengths = [len(a) for a, _ in wire]
    if len(set(lengths)) > 1:
        raise UsageError(
            f"the arrays of the tuple have different lengths {lengths}: features and labels "
            "need one row per sample"
        )
    return [t for _, t in wire], [a for a, _ in wire], isinstance(data, tuple)


def _labels(labels: Any, n: int, what: str) -> np.ndarray:
    """``labels`` as a 1-D numpy array of length ``n``."""
    if not engine._is_array(labels):
        raise UsageError(f"{what} must be a 1-D numpy array or torch tensor of labels, not "
                         f"{type(labels).__name__}")
    arr = engine.to_wire(labels)[0] if not isinstance(labels, np.ndarray) else labels
    if arr.ndim != 1:
        raise UsageError(f"{what} needs one label per row (a 1-D array), not shape "
                         f"{tuple(arr.shape)}: for one-hot labels pass labels.argmax(1)")
    if len(arr) != n:
        raise UsageError(f"{what} has {len(arr)} labels but the data has {n} rows: they must "
                         "be aligned, one label per row")
    return arr


def _call_all(cluster, fn, *args, timeout: float = _CALL_TIMEOUT) -> list:
    """``fn(*args)`` on every rank, in rank order; a one-line error if any rank fails."""
    ars = {s.rank: cluster.client[s.engine_id].apply_async(fn, *args) for s in cluster.slots}
    results, failures = _wait(ars, timeout)
    if failures:
        raise UsageError(_failed(f"{fn.__name__.strip('_')} on the engines", failures))
    return [results[r] for r in sorted(results)]


def _wait(ars: dict, timeout: float) -> tuple[dict, dict]:
    """Wait for every rank's answer: ({rank: result}, {rank: one-line failure})."""
    deadline = time.monotonic() + timeout
    results, failures = {}, {}
    for r, ar in ars.items():
        ar.wait(max(0.0, deadline - time.monotonic()))
        if not ar.ready():
            failures[r] = f"no answer within {timeout:.0f} s (is a cell still running there?)"
            continue
        try:
            results[r] = ar.get(0)
        except Exception as exc:  # RemoteError, EngineError: the rank's own words, one line
            ename, evalue = getattr(exc, "ename", type(exc).__name__), getattr(exc, "evalue", exc)
            failures[r] = f"{ename}: {str(evalue).splitlines()[0] if str(evalue) else ''}"
    return results, failures


def _ranks_text(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _failed(what: str, failures: dict) -> str:
    groups: dict[str, list[int]] = {}
    for r, msg in sorted(failures.items()):
        groups.setdefault(msg, []).append(r)
    return f"{what} failed on " + "; ".join(f"{_ranks_text(rs)}: {m}" for m, rs in groups.items())


def _check_memory(cluster, per_rank: list[int], local: int, what: str, fix: str) -> None:
    """Refuse, with the figures, when a host has less available memory than it would need:
    its ranks' shards, plus ``local`` bytes of copies in the notebook on the notebook's host."""
    import psutil

    need: dict[str, int] = {}
    avail: dict[str, int] = {}
    who: dict[str, list[str]] = {}
    ranks: dict[str, list[int]] = {}
    for r, (host, free) in enumerate(_call_all(cluster, engine._free_memory)):
        need[host] = need.get(host, 0) + per_rank[r]
        avail[host] = min(avail.get(host, free), free)
        ranks.setdefault(host, []).append(r)
    for host, rs in ranks.items():
        who[host] = [_ranks_text(rs)]
    if local:
        here = socket.gethostname()
        need[here] = need.get(here, 0) + local
        avail[here] = min(avail.get(here, 1 << 62), psutil.virtual_memory().available)
        who.setdefault(here, []).append("the notebook")
    for host, needed in need.items():
        if needed > _MEMORY_SHARE * avail[host]:
            raise UsageError(
                f"{what} needs {_human(needed)} of memory on {host} ({' and '.join(who[host])}) "
                f"but only {_human(avail[host])} is available there: {fix}"
            )


# -- scatter --------------------------------------------------------------------------------------
@dataclass
class _Scattered:
    """What the kernel remembers of a scatter, for ``gather``."""

    engine_ids: tuple[int, ...]
    shards: list[Shard]


_scattered: dict[str, _Scattered] = {}


def _rows_of(array: np.ndarray, shard: Shard) -> np.ndarray:
    """A shard's rows of ``array``: a view for a contiguous block, else a copy."""
    if isinstance(shard.rows, slice) and not len(shard.pad):
        return array[shard.rows]
    return np.take(array, shard.indices(), axis=0)


def scatter(
    name: str,
    data,
    *,
    shuffle: bool = True,
    seed: int = 0,
    stratify=None,
    labels=None,
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
    """
    t0 = time.perf_counter()
    _check_name(name)
    if remainder not in _REMAINDERS:
        raise UsageError(f"remainder must be 'drop', 'pad' or 'uneven', not {remainder!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise UsageError(f"seed must be a whole number >= 0, not {seed!r}")
    tags, arrays, is_tuple = _arrays_of(data)
    n = len(arrays[0])
    strat = _labels(stratify, n, "stratify") if stratify is not None else None
    shown = strat if strat is not None else (_labels(labels, n, "labels") if labels is not None
                                             else None)
    cluster = session.current()
    world = len(cluster.slots)
    if n < world:
        raise UsageError(f"the data has {n} rows but there are {world} ranks: each rank needs at "
                         "least one (send more rows, or use fewer ranks)")
    sizes = shard_sizes(n, world, remainder)
    row_bytes = sum(a.nbytes // n for a in arrays)
    copies = shuffle or strat is not None or remainder == "pad"
    _check_memory(
        cluster,
        [s * row_bytes for s in sizes],
        n * row_bytes if copies else 0,
        f"scatter of {name!r}",
        "send less data (fewer rows or a smaller dtype)"
        + (", or shuffle=False to send without a copy" if copies else ""),
    )
    shards = plan(n, world, shuffle=shuffle, seed=int(seed), labels=strat, remainder=remainder)
    meta = dict(
        name=name, world_size=world, sizes=tuple(sizes), pads=tuple(len(s.pad) for s in shards),
        total=n, seed=int(seed), shuffle=shuffle, stratified=strat is not None,
        remainder=remainder,
    )
    _send(cluster, name, tags, arrays, is_tuple, shards, meta)
    _scattered[name] = _Scattered(tuple(s.engine_id for s in cluster.slots), shards)
    cluster.record(  # recovery sends it again to fresh engines, re-sharded to their number
        functools.partial(scatter, name, data, shuffle=shuffle, seed=seed, stratify=stratify,
                          labels=labels, remainder=remainder)
    )
    how = ", ".join(
        [f"shuffled with seed {seed}" if shuffle else "in order"]
        + (["stratified"] if strat is not None else [])
        + [f"remainder {remainder}"]
    )
    report = ShardReport(name, sizes, list(meta["pads"]), n, row_bytes * n,
                         time.perf_counter() - t0, how)
    if shown is not None:
        classes, codes = np.unique(shown, return_inverse=True)
        codes = codes.reshape(-1)
        report.classes = [str(c)[:12] for c in classes]
        report.counts = label_counts(codes, shards, len(classes))
        report.overall = np.bincount(codes, minlength=len(classes))
        report.warnings = label_warnings(report.classes, report.counts, report.overall)
    print(report)
    return report


def _send(cluster, name, tags, arrays, is_tuple, shards, meta) -> None:
    """Send every rank its shard under a private token, then commit the name everywhere; on any
    failure (or an interrupt) drop the token on every rank, so that nothing is left half-sent."""
    token = f"{name}-{uuid.uuid4().hex}"
    client = cluster.client
    ars = {}
    nbytes = sum(s.size for s in shards) * sum(a.nbytes // len(a) for a in arrays)
    try:
        for slot, shard in zip(cluster.slots, shards, strict=True):
            parts = [_rows_of(a, shard) for a in arrays]
            ars[slot.rank] = client[slot.engine_id].apply_async(
                engine._receive, token, dict(meta, rank=slot.rank), tags, is_tuple, *parts
            )
            del parts  # the message holds them until sent; then a copy's memory is freed
        _, failures = _wait(ars, _SEND_TIMEOUT + nbytes / _SLOWEST_RATE)
        if failures:
            raise UsageError(_failed(f"scatter of {name!r}", failures)
                             + "; nothing was kept on any rank")
        commits = {s.rank: client[s.engine_id].apply_async(engine._commit, token, name)
                   for s in cluster.slots}
        _, failures = _wait(commits, _CALL_TIMEOUT)
        if failures:
            raise UsageError(_failed(f"scatter of {name!r}", failures))
    except BaseException:
        for s in cluster.slots:  # best effort: a dead rank has nothing left to drop
            try:
                client[s.engine_id].apply_async(engine._discard, token)
            except Exception:
                pass
        raise


def scatter_variable(ns: dict, var: str, *, target: str | None = None, stratify: str | None = None,
                     labels: str | None = None, **options) -> ShardReport:
    """``%nbdist scatter VAR``: scatter notebook variables, named, to ``target`` (default VAR)."""

    def value(v: str):
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


# -- gather ---------------------------------------------------------------------------------------
def gather(name: str, *, like: str | None = None, ordered: bool = True):
    """Bring the per-rank array or tensor ``name`` (or a tuple of them) into the notebook.

    The ranks' rows are joined in rank order; for a name sent by ``scatter`` they come back in
    the data set's own order (shuffle undone, repeated rows left out). ``like`` names the
    scattered data set whose order a per-rank result follows (predictions made from it, say);
    ``ordered=False`` keeps rank order. Per-rank single values (0-d) come back stacked.
    """
    _check_name(name)
    if like is not None:
        _check_name(like, "like")
    cluster = session.current()
    descs = _call_all(cluster, engine._describe, name)
    missing = [r for r, d in enumerate(descs) if d is None]
    if missing:
        raise UsageError(f"{name!r} is not defined on {_ranks_text(missing)}: define it in a "
                         "%%distributed cell first")
    for r, d in enumerate(descs):
        if not d["ok"]:
            raise UsageError(
                f"gather brings back numpy arrays and torch tensors (or tuples of them), but "
                f"{name!r} on rank {r} is a {d['type']}: bring it with nbdist.pull({name!r}, {r})"
            )
    first = descs[0]
    for r, d in enumerate(descs):
        if (d["is_tuple"], len(d["shapes"])) != (first["is_tuple"], len(first["shapes"])):
            raise UsageError(f"{name!r} is a {first['type']} on rank 0 but a {d['type']} on "
                             f"rank {r}: every rank must hold the same kind of value")
        for i, (shape, dtype) in enumerate(zip(d["shapes"], d["dtypes"], strict=True)):
            shape0, dtype0 = first["shapes"][i], first["dtypes"][i]
            if dtype != dtype0 or shape[1:] != shape0[1:] or (len(shape) == 0) != (not shape0):
                raise UsageError(
                    f"{name!r} has dtype {dtype0} and shape {shape0} on rank 0 but {dtype} and "
                    f"{shape} on rank {r}: the ranks' rows must match to be joined"
                )
    record = _order_of(cluster, name, like, descs) if ordered else None
    total = sum(d["nbytes"] for d in descs)
    _check_local(2 * total, f"gather of {name!r}")
    wait = _SEND_TIMEOUT + total / _SLOWEST_RATE
    answers = _call_all(cluster, engine._export, name, timeout=wait)
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
        out.append(engine.from_wire(joined, tag))
    return tuple(out) if is_tuple else out[0]


def _order_of(cluster, name: str, like: str | None, descs: list[dict]) -> _Scattered | None:
    """The scatter whose order ``name``'s rows follow, checked against the ranks' row counts."""
    key = like or name
    record = _scattered.get(key)
    if record is not None and record.engine_ids != tuple(s.engine_id for s in cluster.slots):
        record = None  # scattered to engines that are gone
    if record is None:
        if like is not None:
            raise UsageError(f"{like!r} was not scattered to the ranks of this cluster: scatter "
                             "it first, or leave like= out to join the ranks' rows in rank order")
        return None
    for r, d in enumerate(descs):
        for shape in d["shapes"]:
            if shape and shape[0] != record.shards[r].size:
                raise UsageError(
                    f"{name!r} has {shape[0]} rows on rank {r} but {key!r} was scattered with "
                    f"{record.shards[r].size} there, so its order cannot be restored: pass "
                    "ordered=False for rank order"
                )
    return record


def _check_local(nbytes: int, what: str) -> None:
    import psutil

    avail = psutil.virtual_memory().available
    if nbytes > _MEMORY_SHARE * avail:
        raise UsageError(f"{what} needs {_human(nbytes)} of memory in the notebook but only "
                         f"{_human(avail)} is available: gather less (a slice per rank)")
