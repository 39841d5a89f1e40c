"""A data loader's position in a checkpoint: ``loader=`` of ``nbdist.checkpoint``,
``nbdist.restore`` and ``nbdist.steps``.

Every rank's position travels in its random-state record (the one each rank already sends
rank 0 at a checkpoint, or writes into its own shard), so it costs no collective of its own. On
restore the loader is handed every rank's saved position that is known (index: the rank that
saved it; None where unknown) and decides itself: its own (the same number of ranks), or the
rest of the epoch split anew (``nbdist.worker.data.plan``).
"""

from __future__ import annotations

from typing import Any

from ...errors import UsageError

KEY = "loader"  # the record's key


def check(where: str, loader: Any) -> None:
    """One line when ``loader`` is not a loader ``nbdist.loader`` made."""
    if loader is None:
        return
    if not (callable(getattr(loader, "state_dict", None)) and hasattr(loader, "_resume")):
        raise UsageError(
            f"nbdist.{where}: loader= takes a loader made by nbdist.loader(...), not "
            f"{type(loader).__name__}: save another object's state with its own keyword"
        )


def put(record: dict, loader: Any) -> None:
    """This rank's position into its record."""
    if loader is not None:
        record[KEY] = loader.state_dict()


def resume(loader: Any, records: list[dict | None], step: int) -> None:
    """Give ``loader`` the positions the ranks saved at ``step``; a note when none was."""
    if loader is None:
        return
    saved = [r.get(KEY) if isinstance(r, dict) else None for r in records]
    if not any(saved):
        print(
            f"nbdist.restore: the checkpoint of step {step} holds no loader position (saved "
            "without loader=, or sharded over another number of ranks): the loader starts its "
            "epoch from the beginning"
        )
        return
    loader._resume(saved)
