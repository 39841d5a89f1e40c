"""A tensor-parallel plan checked, then applied with torch's ``parallelize_module``.

A plan maps submodule names (``"layers.*.attn.q"``; ``*`` matches one level, as torch reads it)
to torch's styles (``ColwiseParallel()``, ``RowwiseParallel()``, ...). torch meets a name that
matches nothing with a warning at best; a plan is checked here first, on every rank before any
communication, so a typo is one line naming the name and the submodules there are.
"""

from __future__ import annotations

import fnmatch
from typing import Any

from ...errors import UsageError


def _matches(pattern: str, name: str) -> bool:
    """Whether ``name`` (dotted) matches ``pattern`` level by level, as torch matches plans."""
    parts, tokens = name.split("."), pattern.split(".")
    return len(parts) == len(tokens) and all(
        fnmatch.fnmatchcase(p, t) for p, t in zip(parts, tokens, strict=True)
    )


def check(model: Any, plan: Any) -> None:
    """One line unless every key of ``plan`` names a submodule and every value is a style."""
    from torch.distributed.tensor.parallel import ParallelStyle

    if not isinstance(plan, dict) or not plan:
        raise UsageError(
            "plan= takes a dict of submodule names to torch's styles, e.g. "
            "{'ff.up': ColwiseParallel(), 'ff.down': RowwiseParallel()}"
        )
    names = [n for n, _ in model.named_modules() if n]
    for key, style in plan.items():
        if not isinstance(key, str) or not any(_matches(key, n) for n in names):
            near = [n for n in names if n.split(".")[-1] == str(key).split(".")[-1]][:3]
            hint = f"did you mean {near}?" if near else f"its submodules start {names[:6]}"
            raise UsageError(f"plan names {key!r}, which is not a submodule of the model: {hint}")
        if not isinstance(style, ParallelStyle):
            raise UsageError(
                f"plan[{key!r}] is {type(style).__name__}, not one of torch's parallel styles "
                "(ColwiseParallel(), RowwiseParallel(), SequenceParallel(), ...)"
            )


def apply(model: Any, tp_mesh: Any, plan: dict) -> Any:
    """``model`` with ``plan`` applied over ``tp_mesh`` (checked first; see ``check``)."""
    check(model, plan)
    from torch.distributed.tensor.parallel import parallelize_module

    return parallelize_module(model, tp_mesh, plan)
