"""How code on an engine sees its process: as a script started by torchrun, not as a REPL.

Frameworks decide how to behave from the process around them. Lightning refuses
``strategy="ddp"`` where ``sys.ps1`` is set (an interactive session); argparse reads
``sys.argv``; scripts open files relative to the working folder, import modules from their own
folder and test ``__name__ == "__main__"``; frameworks install signal handlers and call
``sys.exit``. This module gives every cell and script the process a torchrun worker would see,
and takes back what the code changed that would break the next cell (signal handlers, the
script's folder on ``sys.path``, ``sys.modules["__main__"]``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import types
from collections.abc import Iterator

from ..protocol import Program
from .state import namespace

#: Handlers a framework may replace (Lightning ignores SIGINT after an interrupt, and installs
#: SIGTERM/SIGUSR handlers under Slurm): put back after every cell, so the interrupt button and
#: the engine's own shutdown keep working.
_GUARDED = tuple(
    s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGUSR1", None)) if s is not None
)


def end_on_term() -> None:
    """A SIGTERM ends the engine at once, busy or idle. A scheduler ending the job (``scancel``,
    a time limit, preemption) must not find ranks training on, writing checkpoints, beside the
    job that replaces them (ipyparallel's own handler waits for the running cell); and an idle
    engine asked to stop has nothing left to do but leave: ipyparallel's orderly stop and the
    interpreter's teardown of torch take most of a second, every engine at a stop."""
    previous = signal.getsignal(signal.SIGTERM)
    if getattr(previous, "__qualname__", "").startswith("end_on_term"):
        return

    def on_term(sig: int, frame: object) -> None:
        for stream in (sys.__stdout__, sys.__stderr__):  # the engine's log
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(128 + sig)

    signal.signal(signal.SIGTERM, on_term)


def not_interactive() -> None:
    """Remove the interactive markers IPython sets (``sys.ps1``...): frameworks treat a process
    that has them as a REPL, where they refuse to start distributed training. Rich output does
    not depend on them: ``display()`` goes through the shell's display publisher."""
    for name in ("ps1", "ps2", "ps3"):
        if hasattr(sys, name):
            delattr(sys, name)


@contextlib.contextmanager
def running(program: Program) -> Iterator[dict]:
    """The process as ``program`` expects it, for as long as it runs; yields its globals.

    A cell runs in the engine's namespace. A script runs as ``__main__`` in a fresh module, as
    ``python FILE`` would run it, its folder first on ``sys.path``; when it ends (however it
    ends), its globals join the engine's namespace, as IPython's ``%run`` does, so later cells
    and ``%nbdist pull`` see them.
    """
    handlers = {s: signal.getsignal(s) for s in _GUARDED}
    sys.argv = list(program.argv)
    if program.cwd and os.path.isdir(program.cwd):  # a remote host may not have the folder
        os.chdir(program.cwd)
    ns = namespace()
    if not program.script:
        try:
            yield ns
        finally:
            _restore(handlers)
        return
    folder = os.path.dirname(program.filename)
    module = types.ModuleType("__main__")
    module.__file__ = program.filename
    module.__builtins__ = __builtins__
    module.__dict__["nbdist"] = ns.get("nbdist")  # as in cells: nbdist.rank() unimported
    saved_main = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    sys.path.insert(0, folder)
    try:
        yield module.__dict__
    finally:
        sys.modules["__main__"] = saved_main
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)
        ns.update((k, v) for k, v in module.__dict__.items() if not k.startswith("__"))
        _restore(handlers)


def _restore(handlers: dict) -> None:
    for sig, handler in handlers.items():
        if handler is not None and signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)


def exit_status(exc: SystemExit) -> tuple[str, str] | None:
    """How a ``sys.exit`` ends the cell: None for a clean exit (``sys.exit()``, ``sys.exit(0)``);
    else (kind, one-line summary). A framework that exits after catching an interrupt (Lightning
    calls ``sys.exit(1)`` then) reports the interrupt, not an error."""
    if _caused_by_interrupt(exc):
        return "interrupted", "KeyboardInterrupt (nbdist: interrupted)"
    code = exc.code
    if code is None or code == 0:
        return None
    if isinstance(code, int):
        return "error", f"SystemExit: the code called sys.exit({code})"
    return "error", f"SystemExit: {code}"  # sys.exit("message"): Python prints it, exits with 1


def _caused_by_interrupt(exc: BaseException) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False
