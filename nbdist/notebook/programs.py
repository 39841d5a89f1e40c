"""Scripts on the ranks: ``%nbdist run FILE ARGS`` and ``nbdist.run_script``.

A script runs on every rank as torchrun would run it (``sys.argv == [FILE, *ARGS]``,
``__name__ == "__main__"``, its folder first on ``sys.path``, the notebook's folder as the
working folder), on the persistent engines, with everything a ``%%distributed`` cell has: the
dashboard, ``--timeout``, ``--restarts``, grouped errors, the interrupt button. The file is read
here, in the kernel, and its text sent to the ranks: remote hosts need not have it.
"""

from __future__ import annotations

import os
import tokenize
from pathlib import Path

from .. import paths
from ..config import CellOptions
from ..errors import UsageError
from ..protocol import Program
from . import session


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


def run_watched(program: Program, opts: CellOptions, name: str = "") -> object | None:
    """Run ``program`` (a cell or a script) on the current cluster under the dashboard and the
    run store, as ``opts.extra`` asks (dashboard, total, tensorboard, stop_on_nan)."""
    from .monitor import RunMonitor

    cluster = session.current()
    with RunMonitor(cluster, program.source, opts, name=name, **opts.extra) as monitor:
        return cluster.run_program(program, opts, observers=[monitor])


def run_script(
    file: str | os.PathLike,
    *args: str,
    timeout: float | None = None,
    ranks: tuple[int, ...] | None = None,
    all_output: bool = False,
    restarts: int = 0,
    min_workers: int | None = None,
    progress_timeout: float = 300.0,
    dashboard: bool = True,
    total: int | None = None,
    tensorboard: str | None = None,
    stop_on_nan: bool = False,
    name: str = "",
) -> None:
    """Run the script ``file`` on every rank with ``args`` as its command line, as
    ``torchrun --nproc-per-node N file args...`` would; ``%nbdist run`` from Python.

    The options are ``%%distributed``'s. The script's global names stay on the engines when it
    ends (as after IPython's ``%run``), for later cells and ``%nbdist pull``; the process group
    stays formed (re-formed before the next cell if the script destroyed it).
    """
    program = load(file, args)
    telemetry = {
        "dashboard": dashboard,
        "total": total,
        "tensorboard": tensorboard,
        "stop_on_nan": stop_on_nan,
    }
    opts = CellOptions(
        timeout=timeout,
        ranks=tuple(ranks) if ranks is not None else None,
        all_output=all_output,
        restarts=restarts,
        min_workers=min_workers,
        progress_timeout=progress_timeout,
        extra=telemetry,
    )
    run_watched(program, opts, name or Path(program.name).name)
