"""Which rows go to which rank, and the report of a scatter: pure functions, no cluster.

The plan is a function of the data set's length, its labels and the options only: ``plan()``,
with ``shard_sizes()`` and ``restore_order()`` (its inverse, for ``gather``) as companions.
Shuffling uses one permutation drawn from ``seed``; stratifying deals each class's rows
round-robin, so every shard holds each class within one sample of its share. ``ShardReport`` is
what ``scatter`` prints: rows and label histogram per rank, and a warning for any shard whose
labels differ markedly from the whole (``label_counts``, ``label_warnings``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

Remainder = Literal["drop", "pad", "uneven"]
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
        if isinstance(self.rows, slice):
            return self.rows.stop - self.rows.start
        return len(self.rows)

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

    def take(self, array: np.ndarray) -> np.ndarray:
        """This shard's rows of ``array``: a view for a contiguous block, else a copy."""
        if isinstance(self.rows, slice) and not len(self.pad):
            return array[self.rows]
        return np.take(array, self.indices(), axis=0)


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
    _shown_in: int | None = field(default=None, repr=False, compare=False)

    def show(self) -> None:
        """Print the report (``scatter`` does, whether or not the cell's last line is the
        call); the same cell's display of the returned report then adds nothing."""
        print(self)
        self._shown_in = _cell_count()

    def _ipython_display_(self) -> None:
        # The report as the table (never a repr), once per cell.
        if self._shown_in is None or self._shown_in != _cell_count():
            print(self)

    def add_labels(self, labels: np.ndarray, shards: list[Shard]) -> None:
        """Fill in the label histogram per rank and the warnings, from one label per row."""
        classes, codes = np.unique(labels, return_inverse=True)
        codes = codes.reshape(-1)
        self.classes = [str(c)[:12] for c in classes]
        self.counts = label_counts(codes, shards, len(classes))
        self.overall = np.bincount(codes, minlength=len(classes))
        self.warnings = label_warnings(self.classes, self.counts, self.overall)

    def __str__(self) -> str:
        head = (
            f"nbdist: {self.name!r} scattered to {len(self.sizes)} ranks in {self.seconds:.2f} s "
            f"({self.total:,} rows, {human_bytes(self.nbytes)}; {self.how})"
        )
        cols = ["rank", "rows"] + (["repeated"] if any(self.pads) else [])
        rows = [
            [str(r), f"{s:,}"] + ([str(p)] if any(self.pads) else [])
            for r, (s, p) in enumerate(zip(self.sizes, self.pads, strict=True))
        ]
        total = ["all", f"{self.total:,}"] + ([""] if any(self.pads) else [])
        notes = []
        if self.counts is not None:
            common = np.argsort(-self.overall, kind="stable")[:_SHOWN_CLASSES]
            shown = np.sort(common)  # the most common labels, in the labels' order
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


def _cell_count() -> int | None:
    """The IPython cell running now (its execution count), or None outside IPython."""
    from IPython import get_ipython

    shell = get_ipython()
    return None if shell is None else shell.execution_count


def human_bytes(nbytes: float) -> str:
    """``nbytes`` for people: ``512 bytes``, ``1.3 MB``, ``98.3 GB``."""
    for unit in ("bytes", "KB", "MB", "GB"):
        if nbytes < 1000 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "bytes" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    return ""
