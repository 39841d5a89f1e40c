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

from . import checkpoint, rendezvous, reporter
from .setup import _namespace

#: Values larger than this (pickled) come back to the notebook as their repr only.
_MAX_VALUE_BYTES = 64 * 1024 * 1024


def portable(value: Any) -> dict:
    """``value`` packed to travel to the notebook: pickled here, where it is sure to work.

    Unpickling happens in the notebook's main thread (see ``unpack``), never in ipyparallel's IO
    thread, where an object that cannot be rebuilt (a DDP model needs a process group) would
    break the client. A DDP- or FSDP-wrapped model travels as its inner module.
    """
    import pickle

    value = getattr(value, "module", value) if _is_wrapper(value) else value
    text = _safe_repr(value)
    try:
        try:
            import cloudpickle

            data = cloudpickle.dumps(value)
        except ImportError:
            data = pickle.dumps(value)
    except Exception:
        return {"repr": text}
    if len(data) > _MAX_VALUE_BYTES:
        return {"repr": text}
    return {"pickle": data, "repr": text}


def _is_wrapper(value: Any) -> bool:
    return type(value).__name__ in ("DistributedDataParallel", "FullyShardedDataParallel")


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception as e:
        return f"<{type(value).__name__} (repr failed: {e})>"


def _transform(source: str) -> str:
    """IPython syntax (``%magics``, ``!shell``) to plain Python, as the engine's shell does it."""
    from IPython import get_ipython

    shell = get_ipython()
    return shell.transform_cell(source) if shell is not None else source


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
    source: str,
    filename: str,
    group: dict | None,
    want_value: bool,
    group_timeout: float,
    run_key: str = "default",
) -> dict:
    """Run ``source`` here; return ``{"ok": True, "value": ...}`` or a failure description.

    ``group``, when given, is this rank's new RankInfo: the process group is (re-)formed first,
    on every rank at once, before the cell's own code runs.
    """
    checkpoint.set_run(run_key)
    try:
        reporter.begin_cell()  # ties nbdist.report()'s batches to this request; starts health
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
        out = {"ok": True, "value": portable(value) if want_value and value is not None else None}
    except BaseException as exc:  # noqa: B036 - KeyboardInterrupt is a cell outcome too
        rendezvous.abort()
        out = _failure(exc, filename)
    finally:
        reporter.end_cell()  # the last records go out before the reply
        sys.stdout.flush()
        sys.stderr.flush()
    out["group_formed"] = rendezvous.is_formed()
    return out
