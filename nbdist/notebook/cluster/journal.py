"""What fresh engines must be given again: the cells that succeeded and the scatters, in order.

When recovery replaces an engine, the new one has none of the names earlier cells defined. The
journal keeps, in the order they happened, every cell (or script) that succeeded and every
notebook-side step that sent data (a scatter, as a callable that sends it again), so that
``notebook.run.replay`` can run them again on every rank before the failed cell resumes from
its checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ...protocol import Program

#: A notebook-side step to redo (a scatter): returns None, or one line saying why it could not be
#: redone (its data is gone from the notebook).
Redo = Callable[[], "str | None"]


@dataclass(frozen=True)
class CellEntry:
    """A cell or script that succeeded, with its ranks (None: every rank) and its run's key (so a
    replayed training cell resumes from its own checkpoints)."""

    program: Program
    ranks: tuple[int, ...] | None
    run_key: str


class Journal:
    """The cluster's journal: cells and redo steps, in order (iterate to read them)."""

    def __init__(self) -> None:
        self._entries: list[CellEntry | Redo] = []
        self._keys: dict[str, int] = {}  # a keyed step (a scatter's name): its place
        self.replaying = False  # while True, nothing is added: replay does not record itself

    def __iter__(self) -> Iterator[CellEntry | Redo]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def record(self, redo: Redo, key: str | None = None) -> None:
        """Remember a notebook-side step (a scatter) that recovery must redo on fresh engines.

        A step with the ``key`` of an earlier one (a scatter to the same name) takes its place,
        so repeated scatters do not pile up."""
        if self.replaying:
            return
        if key is not None and key in self._keys:
            self._entries[self._keys[key]] = redo
            return
        if key is not None:
            self._keys[key] = len(self._entries)
        self._entries.append(redo)

    def add_cell(self, program: Program, ranks: tuple[int, ...] | None, run_key: str) -> None:
        """Remember a cell (or script) that succeeded, for replay on fresh engines."""
        if not self.replaying:
            self._entries.append(CellEntry(program, ranks, run_key))
