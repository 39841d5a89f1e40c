"""A failed cell's frames, kept on its rank until the next cell, for a post-mortem.

When a cell raises on a rank, the runner keeps the exception here (``keep``), its frames and
their variables alive, until the next cell starts (``forget``). ``frames()`` describes the
person's frames (a cell, a script, their own modules: not nbdist's, a library's or Python's),
each local as a bounded repr. ``debug(line)`` is a pdb session over them, one command at a
time, driven from the notebook (``%nbdist debug``): the first call opens it at the frame that
raised, in the person's code; ``u``, ``d``, ``w`` move among the person's frames only; ``p``,
``pp``, ``l``, ``a`` and expressions run here, in the frame, and print into the reply; ``q``
ends it. Nothing resumes: a post-mortem has no code left to run (``n``, ``s``, ``c`` say so).
"""

from __future__ import annotations

import contextlib
import io
import linecache
import pdb  # noqa: T100 - a debugger is what this module offers
import reprlib
import types

from ...frames import is_user
from ...protocol import DebugReply, FrameRecord, PostMortem
from .. import state

_LOCALS = 40  # locals described per frame
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 200
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 10
_RESUMING = ("next", "n", "step", "s", "continue", "cont", "c", "until", "unt", "return", "r",
             "jump", "j", "run", "restart")  # fmt: skip


def keep(exc: BaseException, program_file: str) -> None:
    """Keep the exception a cell raised (with ``program_file``, the cell's or script's name)."""
    state.engine.failure = (exc, program_file)
    state.engine.debugger = None


def forget() -> None:
    """A new cell: let the last failure's frames go."""
    state.engine.failure = state.engine.debugger = None


def frames(rank: int) -> PostMortem | None:
    """The kept failure's frames (the person's, outermost first), or None when there is none."""
    kept = state.engine.failure
    if kept is None:
        return None
    exc, program = kept
    out = []
    for frame, line in _stack(exc.__traceback__, program):
        code = frame.f_code
        names = sorted(frame.f_locals)[:_LOCALS]
        out.append(
            FrameRecord(
                file=code.co_filename,
                line=line,
                function=code.co_name,
                source=linecache.getline(code.co_filename, line, frame.f_globals).strip(),
                locals=tuple((n, _repr(frame.f_locals[n])) for n in names if n != "__builtins__"),
            )
        )
    return PostMortem(rank, _summary(exc), tuple(out))


def debug(line: str | None) -> DebugReply:
    """One step of the pdb session: ``None`` opens it (where it stands), a line runs a command."""
    kept = state.engine.failure
    if kept is None:
        return DebugReply("nothing to debug: this rank's last cell did not fail\n", done=True)
    session = state.engine.debugger
    if line is None or session is None:
        session = state.engine.debugger = _Session(*kept)
        return DebugReply(session.where())
    output, done = session.run(line)
    if done:
        state.engine.debugger = None  # the frames stay, for another look
    return DebugReply(output, done)


def _stack(tb: types.TracebackType | None, program: str) -> list:
    """(frame, line) of the person's frames in ``tb``, outermost first (all, if none is)."""
    stack = []
    while tb is not None:
        stack.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    user = [(f, n) for f, n in stack if is_user(f.f_code.co_filename, program)]
    return user or stack[-1:]


def _summary(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _repr(value: object) -> str:
    try:
        return _REPR.repr(value)
    except Exception as e:  # a repr that raises: say so, do not fail the description
        return f"<repr failed: {type(e).__name__}>"


class _Session(pdb.Pdb):
    """pdb over a kept traceback, its stack cut to the person's frames; commands one at a time,
    their output returned instead of written to a terminal."""

    def __init__(self, exc: BaseException, program: str) -> None:
        super().__init__(stdin=io.StringIO(), stdout=io.StringIO(), nosigint=True)
        self.prompt = ""
        self.reset()
        self.setup(None, exc.__traceback__)
        self.stack = [(f, n) for f, n in _stack(exc.__traceback__, program)]
        self._at(len(self.stack) - 1)
        self.summary = _summary(exc)

    def _at(self, index: int) -> None:
        self.curindex = index
        self.curframe = self.stack[index][0]
        with contextlib.suppress(AttributeError):  # a property in later Pythons
            self.curframe_locals = self.curframe.f_locals
        self.lineno = None

    def where(self) -> str:
        """Where the session stands: the exception and its frame, as pdb prints an entry."""
        out = io.StringIO()
        self.stdout = out
        self.message(self.summary)
        self.print_stack_entry(self.stack[self.curindex])
        return out.getvalue()

    def run(self, line: str) -> tuple[str, bool]:
        """Run one command; (what it printed, whether the session ended)."""
        out = io.StringIO()
        self.stdout = out
        command = line.strip().split(" ", 1)[0]
        if command in _RESUMING:
            self.message(
                "post-mortem: the cell has ended, there is nothing left to run; "
                "u/d move between frames, q leaves"
            )
            return out.getvalue(), False
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            stop = self.onecmd(line)
        return out.getvalue(), bool(stop) or command in ("q", "quit", "exit", "EOF")
