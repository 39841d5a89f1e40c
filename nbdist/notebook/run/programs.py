"""What the ranks run: a ``%%distributed`` cell or a script, as a ``Program``, run under the board.

``cell`` makes a cell's ``Program`` (refused in one line when it does not compile); ``load`` a
script's (``%nbdist run FILE ARGS``, ``nbdist.run_script``); ``run_watched`` runs either through
the run's controller, watched by what its options ask for (``observers.assembly``).

A script runs on every rank as torchrun would run it (``sys.argv == [FILE, *ARGS]``,
``__name__ == "__main__"``, its folder first on ``sys.path``, the notebook's folder as the
working folder), on the persistent engines, with everything a ``%%distributed`` cell has: the
dashboard, ``--timeout``, ``--restarts``, grouped errors, the interrupt button. The file is read
here, in the kernel, and its text sent to the ranks: remote hosts need not have it.
"""

from __future__ import annotations

import io
import itertools
import os
import stat
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
from .observers.assembly import assemble

_cell_numbers = itertools.count(1)
#: The largest script ``%nbdist run`` reads: its text is sent whole to every rank.
MAX_SCRIPT_BYTES = 10_000_000


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
    a folder, a device or a FIFO, over ``MAX_SCRIPT_BYTES``, not text, a syntax error) before
    any engine sees it."""
    if not isinstance(file, (str, os.PathLike)) or not str(file).strip():
        raise UsageError(f"%nbdist run: name a script file, not {file!r:.60}")
    shown = os.fspath(file)
    path = paths.expand(shown, "%nbdist run: the script")
    where = f"looked in {Path.cwd()}" if not path.is_absolute() else "check the path"
    if not path.exists():
        raise UsageError(f"%nbdist run: no such file {shown!r} ({where})")
    if path.is_dir():
        raise UsageError(f"%nbdist run: {shown!r} is a folder: name the .py script in it to run")
    source = _text(_read(path, shown))
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


def _read(path: Path, shown: str) -> bytes:
    """The bytes of the regular file at ``path``, at most ``MAX_SCRIPT_BYTES`` of them; a
    device, a FIFO or a socket is refused before it is opened (and checked again once open,
    without waiting for a writer: nothing here blocks or reads forever)."""
    try:
        kind = _not_regular(os.stat(path).st_mode)
        if kind:
            raise UsageError(f"%nbdist run: {shown!r} is {kind}, not a file: name a .py script")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as f:
            opened = os.fstat(f.fileno())
            kind = _not_regular(opened.st_mode)
            if kind:  # replaced since it was looked at
                raise UsageError(f"%nbdist run: {shown!r} is {kind}, not a file: name a .py script")
            data = b"" if opened.st_size > MAX_SCRIPT_BYTES else f.read(MAX_SCRIPT_BYTES + 1)
            size = max(opened.st_size, len(data))
    except OSError as e:
        raise UsageError(f"%nbdist run: cannot read {shown!r}: {e.strerror}") from None
    if size > MAX_SCRIPT_BYTES:
        raise UsageError(
            f"%nbdist run: {shown!r} is {size / 1e6:.1f} MB, over the "
            f"{MAX_SCRIPT_BYTES / 1e6:.0f} MB a script may be (it is sent whole to every rank): "
            "keep data in files the script reads"
        )
    return data


def _not_regular(mode: int) -> str:
    """What a file that is not a regular file is (``""`` for a regular one)."""
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return "" if stat.S_ISREG(mode) else "not a regular file"


_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (a named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _text(data: bytes) -> str | None:
    """A script's bytes as text, as ``tokenize.open`` reads a file (the encoding a PEP 263 line
    declares, else UTF-8; universal newlines), or None when they are not text."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return io.TextIOWrapper(io.BytesIO(data), encoding, line_buffering=True).read()
    except (SyntaxError, UnicodeDecodeError, LookupError):
        return None


def run_watched(cluster: Ranks, program: Program, opts: CellOptions) -> object:
    """Run ``program`` (a cell or a script) on ``cluster``, watched as ``opts`` asks (the run
    store, the dashboard, trackers...): rank 0's value, or the one error the person sees."""
    controller.check(cluster, opts)  # a mistake in the options: one line, nothing recorded
    ranks = opts.ranks if opts.ranks is not None else [s.rank for s in cluster.slots]
    cluster_id = str(getattr(cluster.engines, "cluster_id", "") or "")
    watch = assemble(program.source, opts, ranks, cluster_id=cluster_id)
    return controller.run(cluster, program, opts, watch)
