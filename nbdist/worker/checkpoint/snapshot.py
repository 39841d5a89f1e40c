"""A run's checkpoints as they may leave this machine, for a tracker (``Run.to_mlflow(
checkpoints=True)``, ``to_wandb``, ``to_comet``): ``pinned``.

The folder a run's last checkpoint event names may no longer be that run's: a later run under
the same name moves it aside and writes its own there (``owner.claim``), and a write in progress
leaves temporary files. So the folder is opened once, and everything is read through that one
handle: its run record (``run.json``, written atomically and 0600 by ``owner.claim``) must name
the run being sent; then the record and the complete checkpoints (each with its marker; plain
files only) are hard-linked (copied where links cannot be made) into a private folder beside
them, a snapshot that no later write changes, handed to the tracker by a name that no rename
of the run's folder changes (``/proc/self/fd``); then the record is read again, so a folder
another run took meanwhile is refused all the same. Nothing else goes: no temporary files, no
checkpoint without its marker. A snapshot a killed kernel left behind is pruned as a killed
writer's temporary files are (``files.prune``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from ...errors import UsageError
from . import files, owner

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
#: Why a hard link cannot be made where a copy can: the file system has none, or allows none.
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV}


@contextlib.contextmanager
def pinned(folder: Path, run_id: str, rid: int) -> Iterator[Path]:
    """The complete checkpoints of run ``run_id`` in ``folder`` (run ``rid`` of the run store),
    as a private folder of the same name that is removed on leaving. A UsageError in one line
    when ``folder`` is another run's, or became another run's while it was read."""
    with contextlib.ExitStack() as stack:
        try:
            fd = os.open(folder, _DIR)
        except OSError as e:
            raise UsageError(
                f"run {rid}'s checkpoint folder {folder} cannot be read ({e.strerror}): send "
                "the run without checkpoints=True"
            ) from None
        stack.callback(os.close, fd)
        record = _record(fd)
        if owner.run_of(record) != run_id:
            raise UsageError(_theirs(folder, run_id, rid, owner.run_of(record)))
        temp = files.temp_name(folder / "upload").name
        shutil.rmtree(temp, dir_fd=fd, ignore_errors=True)  # left by a killed process, our pid
        stack.callback(shutil.rmtree, temp, dir_fd=fd, ignore_errors=True)
        try:
            out = _subfolder(stack, fd, temp)
            _pin_all(stack, fd, _subfolder(stack, out, folder.name), folder)
        except FileNotFoundError as e:  # removed under us: by another run's prune
            raise UsageError(
                f"run {rid}'s checkpoint folder {folder} changed while it was read "
                f"({e.filename} went): nothing was sent; send the run again"
            ) from None
        except OSError as e:
            raise UsageError(
                f"run {rid}'s checkpoints in {folder} could not be gathered for sending "
                f"({e.strerror}): send the run without checkpoints=True"
            ) from None
        if (now := _record(fd)) != record:
            raise UsageError(_theirs(folder, run_id, rid, owner.run_of(now)))
        yield _reached(out, folder / temp) / folder.name


def _reached(fd: int, path: Path) -> Path:
    """The folder open as ``fd`` (at ``path``), by a name that no rename changes."""
    by_fd = Path(f"/proc/self/fd/{fd}")
    return by_fd if by_fd.is_dir() else path


def _open(stack: contextlib.ExitStack, name: str, at: int) -> int:
    fd = os.open(name, _DIR, dir_fd=at)
    stack.callback(os.close, fd)
    return fd


def _subfolder(stack: contextlib.ExitStack, at: int, name: str) -> int:
    """A new private folder ``name`` in the folder ``at``, opened."""
    os.mkdir(name, 0o700, dir_fd=at)
    return _open(stack, name, at)


def _record(fd: int) -> bytes | None:
    """The run record of the folder open as ``fd``, as written; None when it has none."""
    try:
        f = os.open(owner.RECORD, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
    except OSError:
        return None
    with os.fdopen(f, "rb") as stream:
        return stream.read(1 << 16)


def _pin_all(stack: contextlib.ExitStack, src: int, dst: int, folder: Path) -> None:
    """The run record and the complete checkpoints of the folder ``src``, pinned in ``dst``."""
    _pin(src, owner.RECORD, dst, folder)
    for _, name in files.marked(os.listdir(src)):
        _pin(src, files.marker_name(name), dst, folder)
        if not name.endswith(".dcp"):
            _pin(src, name, dst, folder)
            continue
        inner, out = _open(stack, name, src), _subfolder(stack, dst, name)
        for shard in os.listdir(inner):
            _pin(inner, shard, out, folder / name)


def _pin(src: int, name: str, dst: int, where: Path) -> None:
    """The plain file ``name`` of the folder ``src`` linked (or copied) into ``dst``."""
    if not stat.S_ISREG(os.stat(name, dir_fd=src, follow_symlinks=False).st_mode):
        raise UsageError(
            f"{where / name} is not a plain file (a link?), which no checkpoint holds: refused "
            "to send it; delete that checkpoint, or send the run without checkpoints=True"
        )
    try:
        os.link(name, name, src_dir_fd=src, dst_dir_fd=dst, follow_symlinks=False)
        return
    except OSError as e:
        if e.errno not in _NO_LINKS:
            raise
    fin = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=src)
    fout = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dst)
    with os.fdopen(fin, "rb") as a, os.fdopen(fout, "wb") as b:
        shutil.copyfileobj(a, b, 1 << 20)


def _theirs(folder: Path, run_id: str, rid: int, other: str | None) -> str:
    """The line refusing a folder whose record names ``other``, saying where run ``rid``'s
    checkpoints went when a later run moved them aside."""
    named = f"run {other!r}" if other else "no run"
    moved = next((p for p in _earlier(folder) if owner.run_of(_read(p)) == run_id), None)
    where = f"; run {rid}'s own moved to {moved}" if moved else ""
    return (
        f"run {rid}'s checkpoint folder {folder} now holds another run's checkpoints (its run "
        f"record names {named}){where}: send the run without checkpoints=True"
    )


def _earlier(folder: Path) -> list[Path]:
    return sorted(folder.parent.glob(f"{folder.name}.earlier-*"))


def _read(folder: Path) -> bytes | None:
    try:
        return (folder / owner.RECORD).read_bytes()
    except OSError:
        return None
