"""A sweep's trial on this engine: its values as names, ``nbdist.trial()``, and what it leaves.

The kernel sends a trial's cell with a ``TrialInfo`` and the RankInfo of the trial's own process
group (its ranks only), so ``nbdist.rank()``, ``world_size()`` and the torchrun variables describe
the trial. Before the cell runs, each swept name is defined with the trial's value; after it, the
names the cell bound (new, or bound to another object) are kept under the trial's id, so the
winner's model can be pulled once later trials have run on the same engine
(``%nbdist pull model --trial best``).
"""

from __future__ import annotations

from ..protocol import PackedValue, TrialInfo
from .state import engine, namespace


def trial() -> TrialInfo | None:
    """This cell's trial of a sweep (its ``trial`` id and ``values``), or None outside a sweep."""
    return engine.trial


def begin(info: TrialInfo | None) -> dict[str, int] | None:
    """Enter ``info`` (None: not a trial): define its names; what is bound now, by identity."""
    engine.trial = info
    if info is None:
        return None
    ns = namespace()
    ns.update(info.values)
    return {k: id(v) for k, v in ns.items()}


def end(info: TrialInfo | None, before: dict[str, int] | None) -> None:
    """Keep the names the trial's cell bound, under its id."""
    if info is None or before is None:
        return
    ns = namespace()
    engine.trial_spaces[info.trial] = {
        k: v
        for k, v in ns.items()
        if not k.startswith("_") and (before.get(k) != id(v) or k in info.values)
    }


def fetch(trial_id: int, name: str) -> PackedValue | None:
    """The packed value ``name`` had when trial ``trial_id`` ended here; None when unknown."""
    from .values import portable

    space = engine.trial_spaces.get(trial_id)
    return portable(space[name]) if space is not None and name in space else None


def forget(keep: tuple[int, ...] = ()) -> None:
    """Drop what the trials left, except those in ``keep`` (the sweep's best)."""
    for t in [t for t in engine.trial_spaces if t not in keep]:
        del engine.trial_spaces[t]
