"""Run one ``%%distributed`` cell (or script) on this engine and describe how it went.

A cell runs in the engine's user namespace, so names persist between cells as in a notebook; a
script runs as ``__main__`` (see ``script``).
On any exception the rank leaves its process group at once, so peers waiting for it in a
collective fail within milliseconds instead of hanging until the collective's timeout.
"""

from __future__ import annotations

import ast
import dataclasses
import linecache
import os
import re
import sys
import time
import traceback

from ..errors import CheckpointWriteError, NbdistError
from ..frames import is_user, package
from ..protocol import CellOutcome, CellRequest, PackedValue, Program
from . import console, host, rendezvous, script, state, trials
from .checkpoint import save as checkpoint
from .collectives import counting
from .continuity import rebinding, snapshot
from .data import workers as loader_workers
from .debug import postmortem, stacks
from .debug import profile as profiler
from .reporting import sender
from .values import portable


def _transform(program: Program) -> str:
    """A cell's IPython syntax (``%magics``, ``!shell``) as plain Python, as the engine's shell
    does it; a script is plain Python already."""
    from IPython import get_ipython

    shell = get_ipython()
    if program.script or shell is None:
        return program.source
    return shell.transform_cell(program.source)


def _failure(exc: BaseException, program: str) -> CellOutcome:
    """The exception as the notebook shows it: the person's frames, each run of a library's
    folded into one line, and a one-line summary."""
    tb = traceback.TracebackException.from_exception(exc)
    ours = isinstance(exc, NbdistError)
    lines = _format(tb, program, ours)
    if ours and lines:
        lines[-1] = f"{type(exc).__name__}: {exc}\n"  # not nbdist.errors.UsageError
    summary = lines[-1].strip() if lines else repr(exc)
    # gloo's messages carry a C++ source path and a paragraph of advice: keep the fact only.
    summary = re.sub(r"\[/\S+?\.(cc|cpp|h):\d+\] ", "", summary).split(" This is typically")[0]
    kind = "interrupted" if _interrupted(exc) else "error"
    if isinstance(exc, CheckpointWriteError):
        kind = "storage"  # the storage failed, not the person's code: --restarts retries it
    if isinstance(exc, SystemExit):
        kind, summary = script.exit_status(exc) or ("ok", "")
        lines = lines[-1:] if kind == "error" else []  # where it exited says nothing more
    elif kind == "interrupted":
        summary = "KeyboardInterrupt (nbdist: interrupted)"
    return CellOutcome(kind=kind, at=time.time(), summary=summary, traceback="".join(lines[:-1]))


def _interrupted(exc: BaseException) -> bool:
    """The interrupt, however a library passed it on: torch's C++ turns a KeyboardInterrupt
    raised in a Python process group (nbdist's shared-memory all-reduce) into a RuntimeError
    that names it."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt) or (
            isinstance(seen, RuntimeError) and "KeyboardInterrupt" in str(seen)
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _format(tb: traceback.TracebackException, program: str, ours: bool) -> list[str]:
    """``tb`` (and the exceptions it came from) as ``traceback`` writes it, but nbdist's runner
    left out (and, for nbdist's own errors, every nbdist frame: the person sees their line and
    the message), and each run of frames not the person's folded into one line."""
    out: list[str] = []
    if tb.__cause__ is not None:
        out += _format(tb.__cause__, program, False)
        out.append("\nThe above exception was the direct cause of the following exception:\n\n")
    elif tb.__context__ is not None and not tb.__suppress_context__:
        out += _format(tb.__context__, program, False)
        out.append("\nDuring handling of the above exception, another exception occurred:\n\n")
    frames = [
        f
        for f in tb.stack
        if f.filename not in _OWN_FILES and not (ours and f.filename.startswith(_PACKAGE))
    ]
    if frames:
        out.append("Traceback (most recent call last):\n")
    run: list[traceback.FrameSummary] = []
    for f in [*frames, None]:
        if f is not None and not is_user(f.filename, program):
            run.append(f)
            continue
        if run:
            n = f"{len(run)} frames" if len(run) > 1 else "1 frame"
            out.append(f"  … {n} in {package(run[-1].filename)} {run[-1].name}\n")
            run = []
        if f is not None:
            out += traceback.StackSummary.from_list([f]).format()
    return out + list(tb.format_exception_only())


_OWN_FILES = {__file__, script.__file__}
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _execute(program: Program, want_value: bool) -> PackedValue | None:
    """Run ``program`` (in the process ``script.running`` sets up); its last expression's value,
    packed, when ``want_value`` and the program is a cell."""
    code = _transform(program)
    tree = ast.parse(code, program.filename)
    linecache.cache[program.filename] = (len(code), None, code.splitlines(True), program.filename)
    last = None
    if not program.script and tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body.pop()
    with script.running(program) as ns:
        exec(compile(tree, program.filename, "exec"), ns)
        value = None
        if last is not None:
            value = eval(compile(ast.Expression(last.value), program.filename, "eval"), ns)
    return portable(value) if want_value and value is not None else None


def _async_ranks(when: str) -> None:
    """A cell's start or end for ranks trained with ``sync="async"`` (they meet the global
    model there: ``train.asynchronous``); nothing to import while nothing is prepared."""
    if state.engine.training_plans:
        from .train import asynchronous

        getattr(asynchronous, when)()


def run_cell(req: CellRequest) -> CellOutcome:
    """Run ``req.program`` here; say how it went (with the value of a cell's last expression when
    ``req.want_value``).

    ``req.group``, when given, is this rank's new RankInfo: the process group is (re-)formed
    first, on every rank at once, before the cell's own code runs.
    """
    opts = req.options
    checkpoint.set_run(req.run_key, req.run_id, opts.resume)
    postmortem.forget()  # the last failure's frames: kept until now
    stacks.install()  # where this rank is, on a signal, even if the last cell took the handler
    state.engine.program_file = req.program.filename
    bound = None
    printed = console.sent()
    began = time.monotonic()
    host.busy()  # gloo's loop ticks again (host.idle: asleep between cells)
    try:
        # ties nbdist.report()'s batches to this request, and samples health while it runs
        sender.begin_cell(req.telemetry, opts)
        counting.begin_cell()  # the collectives this cell enters, counted
        if req.group is not None:
            rendezvous.form(req.group, req.group_timeout)
        if req.rebind:  # every rank runs it: what earlier cells made, bound to this group
            for line in rebinding.at_cell_start():
                print(line, flush=True)
        bound = trials.begin(req.trial)
        if opts.profile:
            profiler.start(opts.profile)
        _async_ranks("begin_cell")
        out = CellOutcome(kind="ok", at=time.time(), value=_execute(req.program, req.want_value))
        _async_ranks("end_cell")
        for line in snapshot.keep():  # for a replacement, should this engine be lost
            print(line, flush=True)
    except BaseException as exc:  # noqa: B036 - KeyboardInterrupt and SystemExit are outcomes too
        out = _failure(exc, req.program.filename)
        if out.kind != "ok":
            rendezvous.abort()
            loader_workers.reclaim()  # not held by the frames postmortem keeps
            postmortem.keep(exc, req.program.filename)  # for %nbdist debug, until the next cell
    finally:
        profiled = profiler.finish() if opts.profile else None
        trials.end(req.trial, bound)
        sender.end_cell()  # the last records go out before the reply
        sys.stdout.flush()
        sys.stderr.flush()
        host.release_heap(time.monotonic() - began)  # what the cell freed, back to the OS
        host.idle()
    return dataclasses.replace(
        out,
        group_formed=rendezvous.is_formed(),
        collectives=state.engine.collective_calls,
        pipeline=state.engine.pipeline,
        mesh=state.engine.mesh,
        profile=profiled,
        printed=printed is None or console.sent() != printed,  # uncounted: assume it did
    )
