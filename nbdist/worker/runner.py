"""Run one ``%%distributed`` cell on this engine and describe how it went.

The cell runs in the engine's user namespace, so names persist between cells as in a notebook.
On any exception the rank leaves its process group at once, so peers waiting for it in a
collective fail within milliseconds instead of hanging until the collective's timeout.
"""

from __future__ import annotations

import ast
import linecache
import re
import sys
import time
import traceback
from typing import Any

from . import rendezvous
from .setup import _namespace

#: Values larger than this (pickled) come back to the notebook as their repr only.
_MAX_VALUE_BYTES = 64 * 1024 * 1024


class ValueRepr:
    """Stands in for a last-expression value that cannot travel (unpicklable or huge)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _transform(source: str) -> str:
    from IPython import get_ipython

    shell = get_ipython()
    return shell.transform_cell(source) if shell is not None else source


def _portable(value: Any) -> Any:
    """The value itself when it can travel to the notebook, else its repr."""
    import pickle

    try:
        import cloudpickle

        size = len(cloudpickle.dumps(value))
    except Exception:
        try:
            size = len(pickle.dumps(value))
        except Exception:
            return ValueRepr(repr(value))
    return value if size <= _MAX_VALUE_BYTES else ValueRepr(repr(value))


def _failure(exc: BaseException, filename: str) -> dict:
    """The exception as the notebook shows it: the user's frames only, and a one-line summary."""
    tb = traceback.TracebackException.from_exception(exc)
    # Drop this module's frame above the user's cell.
    frames = [f for f in tb.stack if f.filename != __file__]
    tb.stack = traceback.StackSummary.from_list(frames)
    lines = list(tb.format())
    summary = lines[-1].strip() if lines else repr(exc)
    # gloo's messages carry a C++ source path and a paragraph of advice: keep the fact only.
    summary = re.sub(r"\[/\S+?\.(cc|cpp|h):\d+\] ", "", summary).split(" This is typically")[0]
    kind = "interrupted" if isinstance(exc, KeyboardInterrupt) else "error"
    if kind == "interrupted":
        summary = "KeyboardInterrupt (nbdist: interrupted)"
    return {
        "ok": False,
        "summary": summary,
        "traceback": "".join(lines[:-1]),
        "kind": kind,
        "at": time.time(),
    }


def run_cell(
    source: str, filename: str, group: dict | None, want_value: bool, group_timeout: float
) -> dict:
    """Run ``source`` here; return ``{"ok": True, "value": ...}`` or a failure description.

    ``group``, when given, is this rank's new RankInfo: the process group is (re-)formed first,
    on every rank at once, before the cell's own code runs.
    """
    try:
        if group is not None:
            rendezvous.form(group, group_timeout)
        code = _transform(source)
        tree = ast.parse(code, filename)
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        ns = _namespace()
        exec(compile(tree, filename, "exec"), ns)
        value = None
        if last is not None:
            value = eval(compile(ast.Expression(last.value), filename, "eval"), ns)
        out = {"ok": True, "value": _portable(value) if want_value and value is not None else None}
    except BaseException as exc:  # noqa: B036 - KeyboardInterrupt is a cell outcome too
        rendezvous.abort()
        out = _failure(exc, filename)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    out["group_formed"] = rendezvous.is_formed()
    return out
