"""``for step in nbdist.steps(total, every=K, **state):`` a training loop that resumes itself.

Before the first step it restores the latest good checkpoint of this run into ``state``
(``checkpoint.restore``); it then yields the indices of the steps still to do, from where the
run left off up to ``total - 1``; and after the body of every K-th step has finished (step
``s`` with ``(s + 1) % K == 0``) it saves a checkpoint saying ``s + 1`` steps are done, plus one
after the last step, so a finished run resumes as finished. The loop owns the step numbers, so
the saved step and the resumed one cannot disagree by one.

A checkpoint is written only when the loop asks for the next step, i.e. after the body: a body
that raises or ``break``s leaves no checkpoint of its half-done step.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ...errors import UsageError
from . import positions
from . import save as checkpoint


def _whole(name: str, value: object, least: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise UsageError(f"nbdist.steps: {name} must be a whole number >= {least}, not {value!r}")
    return value


def steps(
    total: int,
    every: int,
    *,
    dir: checkpoint.Folder = None,
    run: str | None = None,
    keep: int = 3,
    loader: Any = None,
    **state,
) -> Iterator[int]:
    """The step indices ``0 .. total - 1`` still to do in this run, checkpointing ``state``
    after every ``every``-th step and after the last.

    Call it on every rank, with the same arguments. ``state`` is what ``nbdist.checkpoint``
    takes (models, optimizers, schedulers, generators, dicts of tensors and plain values);
    ``dir``, ``run``, ``keep`` and ``loader`` are as there: with ``loader=dl``, an iterator
    made from ``dl`` once the loop has begun (or one made before whose first batch is asked
    for then) continues the saved epoch. Arguments are checked here, before any step.
    """
    _whole("total", total, 0)
    _whole("every", every, 1)
    if not state:
        raise UsageError("nbdist.steps: name what to save, e.g. model=model, opt=opt")
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        raise UsageError(f"nbdist.steps: keep must be a whole number >= 1, not {keep!r}")
    positions.check("steps", loader)
    return _loop(total, every, dir, run, keep, loader, state)


def _loop(
    total: int,
    every: int,
    dir: checkpoint.Folder,
    run: str | None,
    keep: int,
    loader: Any,
    state: dict,
) -> Iterator[int]:
    start = checkpoint.restore(dir=dir, run=run, loader=loader, **state)
    for step in range(start, total):
        yield step  # the body runs here; what follows runs only once it has finished
        if (step + 1) % every == 0 or step + 1 == total:
            checkpoint.save(step, dir=dir, run=run, keep=keep, state=state, loader=loader)
