"""The errors nbdist shows to people, and how errors from many ranks are grouped into one.

``UsageError`` is a mistake in what the person asked for: IPython shows it as one line.
``DistributedCellError`` is a failure of the code in a ``%%distributed`` cell on some ranks: it
renders as one readable report, root cause first, identical errors grouped ("ranks 0, 2: ...").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from IPython.core.error import UsageError as _IPythonUsageError

#: Messages that mark a rank as a bystander: it failed because a peer went away, not by itself.
_BYSTANDER_MARKS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "remote worker crashing",
    "NCCL communicator was aborted",
    "Broken pipe",
    "nbdist: interrupted",
    "all-reduce through shared memory stopped",  # worker.collectives.shared_memory.Aborted
)


class NbdistError(Exception):
    """Base class of nbdist's own errors."""


class UsageError(NbdistError, _IPythonUsageError):
    """Bad input: shown as one line that names the problem and the fix."""

    def _render_traceback_(self) -> list[str]:
        # IPython shows only its own UsageError (not subclasses) as one line; do it ourselves.
        return [f"UsageError: {self}"]


@dataclass(frozen=True)
class RankFailure:
    """What went wrong on one rank: the exception's one-line summary and its traceback."""

    rank: int
    summary: str  # "ValueError: bad shape"
    traceback: str = ""  # formatted, without the summary line
    at: float = 0.0  # time.time() on the engine when it failed
    kind: str = "error"  # error | interrupted | storage | died | timeout | hung

    @property
    def bystander(self) -> bool:
        """True when the rank failed only because another rank went away or was stopped."""
        return self.kind == "interrupted" or any(m in self.summary for m in _BYSTANDER_MARKS)


def rank_list(ranks: Iterable[int]) -> str:
    """ "rank 3", "ranks 0, 2" or, for runs of three or more, "ranks 0-63, 65": short at any
    number of ranks."""
    ranks = sorted(set(ranks))
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{ranks[i]}-{ranks[j]}")
        else:
            parts.extend(str(r) for r in ranks[i : j + 1])
        i = j + 1
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts)


def trim(text: str, head: int = 40, tail: int = 20) -> str:
    """Keep the first ``head`` and last ``tail`` lines of a long text."""
    lines = text.splitlines()
    if len(lines) <= head + tail:
        return text
    cut = len(lines) - head - tail
    return "\n".join(lines[:head] + [f"... ({cut} lines cut) ..."] + lines[-tail:])


def trim_repr(value: object, width: int = 40) -> str:
    """``repr(value)``, cut to ``width`` characters (for one-line errors)."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def group_failures(failures: Iterable[RankFailure]) -> list[tuple[list[int], RankFailure]]:
    """Group identical failures (summary and traceback); in the order of ``cause``'s rule:
    root causes first (earliest first, then lowest rank), bystanders last. Each group's
    failure is its lowest rank's."""
    return _grouped(failures, lambda f: (f.summary, f.traceback))


@dataclass(frozen=True)
class Cause:
    """The failure that explains a run's end, and every rank that failed alike."""

    ranks: tuple[int, ...]
    failure: RankFailure  # the lowest of those ranks'

    def line(self) -> str:
        """ "ranks 0-3: ValueError: bad shape": the summary's first line, at most 300 characters."""
        first = (self.failure.summary.splitlines() or [""])[0]
        return f"{rank_list(self.ranks)}: {first[:300]}"


def cause(failures: Iterable[RankFailure]) -> Cause | None:
    """The one rule for "the cause", wherever a failure is shown (the cell, the board, the run
    store and the sidebar): among the failures that were not a bystander's, those alike (the
    same summary) with the earliest failure among them, named by every rank; the lowest rank's
    stands for them. None when every failure was a bystander's (or there is none)."""
    groups = _grouped(failures, lambda f: f.summary)
    if not groups or groups[0][1].bystander:
        return None
    return Cause(tuple(sorted(groups[0][0])), groups[0][1])


def _grouped(failures: Iterable[RankFailure], key) -> list[tuple[list[int], RankFailure]]:
    groups: dict[object, list[RankFailure]] = {}
    for f in failures:
        groups.setdefault(key(f), []).append(f)
    ordered = sorted(
        groups.values(),
        key=lambda fs: (fs[0].bystander, min(f.at for f in fs), min(f.rank for f in fs)),
    )
    return [(sorted(f.rank for f in fs), min(fs, key=lambda f: f.rank)) for fs in ordered]


class DistributedCellError(NbdistError):
    """A ``%%distributed`` cell failed on one or more ranks."""

    def __init__(self, failures: list[RankFailure], note: str = ""):
        self.failures = failures
        self.groups = group_failures(failures)
        self.note = note
        self.root = cause(failures)
        ranks, first = (self.root.ranks, self.root.failure) if self.root else self.groups[0]
        super().__init__(f"{rank_list(ranks)}: {first.summary}")

    @property
    def root_ranks(self) -> list[int]:
        """The ranks whose failure came first and was not caused by another rank (``cause``)."""
        return list(self.root.ranks) if self.root else self.groups[0][0]

    def report(self) -> str:
        """The whole report, as plain text."""
        parts = []
        for i, (ranks, f) in enumerate(self.groups):
            if i == 1 and f.bystander:
                parts.append("-- then, as a consequence --")
            body = f"{rank_list(ranks)}: {f.summary}"
            if f.traceback and not f.bystander:
                body = trim(f.traceback.rstrip()) + "\n" + body
            parts.append(body)
        if self.note:
            parts.append(self.note)
        return "\n".join(parts)

    def _render_traceback_(self) -> list[str]:
        # IPython calls this instead of printing nbdist's own stack: the person sees their error.
        return ["DistributedCellError: " + str(self), *self.report().splitlines()]


class CellInterrupted(KeyboardInterrupt):
    """The interrupt button stopped a cell (or script) on every rank.

    A ``KeyboardInterrupt``, so code that catches one still does; shown as one line, not as
    the stack of nbdist's own calls that were waiting for the ranks."""

    def __init__(self, message: str = "nbdist: the cell was interrupted on every rank"):
        super().__init__(message)

    def _render_traceback_(self) -> list[str]:
        return [f"KeyboardInterrupt: {self}"]


class CheckpointWriteError(NbdistError):
    """A checkpoint could not be written (disk full, folder gone, I/O error): the storage
    failed, not the person's code, so ``--restarts`` retries the cell."""
