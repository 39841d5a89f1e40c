"""What the ranks run: a ``%%distributed`` cell or a script, as a ``Program``, run under the board.

``cell`` makes a cell's ``Program`` (refused in one line when it does not compile); ``load`` a
script's (``%nbdist run FILE ARGS``, ``nbdist.run_script``); ``run_watched`` runs either under
the dashboard and the run store (``monitor.RunMonitor``) through the run's controller.

A script runs on every rank as torchrun would run it (``sys.argv == [FILE, *ARGS]``,
``__name__ == "__main__"``, its folder first on ``sys.path``, the notebook's folder as the
working folder), on the persistent engines, with everything a ``%%distributed`` cell has: the
dashboard, ``--timeout``, ``--restarts``, grouped errors, the interrupt button. The file is read
here, in the kernel, and its text sent to the ranks: remote hosts need not have it.
"""

from __future__ import annotations

import itertools
import os
import tokenize
from collections.abc import Callable
from pathlib import Path

from ... import paths
from ...config import CellOptions
from ...errors import UsageError
from ...frames import CELL_PREFIX
from ...protocol import Program
from ..cluster.ranks import Ranks
from . import controller
from .monitor import RunMonitor

_cell_numbers = itertools.count(1)


def cell(source: str, transform: Callable[[str], str] | None = None) -> Program:
    """A ``%%distributed`` cell as the ranks run it (``transform``: IPython's, for magics in
    it); a syntax error is one UsageError line, before anything is sent."""
    try:
        compile((transform or (lambda s: s))(source), "<cell>", "exec")
    except SyntaxError as e:
        line = (e.text or "").strip()
        where = f"line {e.lineno}" + (f": {line}" if line else "")
        raise UsageError(f"syntax error in the cell ({e.msg}), {where}") from None
    name = f"{CELL_PREFIX}{next(_cell_numbers)}>"
    return Program(source=source, filename=name, argv=(name,), cwd=os.getcwd())


def load(file: str | os.PathLike, args: tuple[str, ...] | list[str] = ()) -> Program:
    """``file`` as the ranks will run it; a one-line UsageError when it cannot be run (missing,
    a folder, not text, a syntax error) before any engine sees it."""
    if not isinstance(file, (str, os.PathLike)) or not str(file).strip():
        raise UsageError(f"%nbdist run: name a script file, not {file!r:.60}")
    shown = os.fspath(file)
    path = paths.expand(shown, "%nbdist run: the script")
    where = f"looked in {Path.cwd()}" if not path.is_absolute() else "check the path"
    if not path.exists():
        raise UsageError(f"%nbdist run: no such file {shown!r} ({where})")
    if path.is_dir():
        raise UsageError(f"%nbdist run: {shown!r} is a folder: name the .py script in it to run")
    try:
        with tokenize.open(path) as f:  # the encoding a PEP 263 line declares, else UTF-8
            source = f.read()
    except (SyntaxError, UnicodeDecodeError):
        source = None
    except OSError as e:
        raise UsageError(f"%nbdist run: cannot read {shown!r}: {e.strerror}") from None
    if source is None or "\0" in source:
        raise UsageError(f"%nbdist run: {shown!r} is not a Python script (it is not text)")
    absolute = str(path.resolve())
    try:
        compile(source, absolute, "exec", dont_inherit=True)
    except SyntaxError as e:
        line = (e.text or "").strip()
        at = f"line {e.lineno}" + (f": {line}" if line else "")
        raise UsageError(f"%nbdist run: syntax error in {shown} ({e.msg}), {at}") from None
    bad = [a for a in args if not isinstance(a, str)]
    if bad:
        raise UsageError(f"script arguments must be strings, as on a command line, not {bad[0]!r}")
    return Program(
        source=source,
        filename=absolute,
        argv=(shown, *args),
        script=True,
        cwd=os.getcwd(),
    )


def run_watched(cluster: Ranks, program: Program, opts: CellOptions, name: str = "") -> object:
    """Run ``program`` (a cell or a script) on ``cluster`` under the dashboard and the run
    store, as ``opts.extra`` asks (dashboard, total, tensorboard, stop_on_nan)."""
    with RunMonitor(cluster, program.source, opts, name=name, **opts.extra) as monitor:
        return controller.run(cluster, program, opts, observers=[monitor])
