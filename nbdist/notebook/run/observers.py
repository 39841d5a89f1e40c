"""What watches a run from the kernel: the interface the run controller calls.

The controller (``controller``) tells every observer of the run's phase changes and its
recovery events, and the supervisor hands it the ranks at every poll (about 50 times a second,
so ``on_poll`` must be cheap; each rank is a ``board.collector.RankFeed``). ``RunMonitor``
(``monitor``: the collector, the dashboard and the run store) implements it; tests implement it
to watch a run.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from ..board.collector import RankFeed


class Phase(enum.Enum):
    """Where a run is. ``controller.TRANSITIONS`` says which change may follow which."""

    STARTING = "starting"
    RUNNING = "running"
    RECOVERING = "recovering"
    FINISHED = "finished"
    FAILED = "failed"
    INTERRUPTED = "interrupted"

    @property
    def terminal(self) -> bool:
        return self in (Phase.FINISHED, Phase.FAILED, Phase.INTERRUPTED)


@runtime_checkable
class RunObserver(Protocol):
    """Told what a run does, from the kernel's main thread."""

    def on_phase(self, old: Phase, new: Phase) -> None:
        """The run moved from ``old`` to ``new`` (always along ``controller.TRANSITIONS``)."""

    def on_event(self, kind: str, rank: int | None, message: str, data: Mapping[str, Any]) -> None:
        """Recovery did something: ``failure`` (a rank was lost), ``restart`` (running again)."""

    def on_poll(self, ranks: Mapping[int, RankFeed]) -> None:
        """The ranks of the running cell, at each look of the supervisor."""

    def hung_ranks(self, timeout: float) -> list[int]:
        """Ranks that reported progress once but none for ``timeout`` seconds."""


class Observer:
    """A ``RunObserver`` that does nothing: subclass it and override what you watch."""

    def on_phase(self, old: Phase, new: Phase) -> None:
        pass

    def on_event(self, kind: str, rank: int | None, message: str, data: Mapping[str, Any]) -> None:
        pass

    def on_poll(self, ranks: Mapping[int, RankFeed]) -> None:
        pass

    def hung_ranks(self, timeout: float) -> list[int]:
        return []
