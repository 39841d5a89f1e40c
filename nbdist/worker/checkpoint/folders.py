"""A run's checkpoint folder: where it is (``run_folder``) and how it is made (``prepare``).

A folder given as ``dir=`` must be the person's own, like the data folder: one that others may
write (without the sticky bit) could have checkpoints planted or swapped in. The run's own folder
is made 0700, in a parent only we may change, and its creation is the check: one that exists
already, or appears between the check and the ``mkdir`` (another user's, in a shared sticky
folder like /tmp), must be a real folder (not a link) that we own and only we may change
(``lstat``), or it is refused in one line.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

from ...errors import UsageError
from ...paths import others_may_write
from . import files

_RUN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
#: Causes that are the storage's, not the person's: a write failing so is retried.
_STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG, errno.ESTALE}


def run_folder(dir: str | os.PathLike | None, run: str) -> Path:
    """The folder of run ``run``'s checkpoints under ``dir`` (default: the data dir's)."""
    if not isinstance(run, str) or not _RUN.fullmatch(run):
        raise UsageError(
            f"nbdist: run={run!r} cannot name a checkpoint folder: use letters, digits, '.', "
            "'_' and '-' (at most 100, not starting with '.')"
        )
    if dir is None:
        from ... import datadir

        return datadir.private_dir(datadir.ensure() / "checkpoints") / run
    try:
        base = Path(dir).expanduser()
    except (TypeError, RuntimeError) as e:  # not a path; ~user with no such user
        raise UsageError(
            f"nbdist: dir= must be a folder's path, not the {type(dir).__name__} "
            f"{repr(dir)[:60]} ({e})"
        ) from None
    _check_trusted(base)  # the run's own folder is checked as prepare() makes it
    return base / run


def _check_trusted(folder: Path) -> None:
    """Refuse an existing ``folder`` that someone else owns or may change: checkpoints there
    could be planted, or this run's folder swapped for theirs. A sticky folder (like /tmp)
    lets others write but not rename what is ours, so it passes when the run's folder is ours."""
    try:
        st = os.stat(folder)
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return  # made 0700 by prepare(); a file in the way is prepare()'s one line
    except OSError:
        return  # unreadable: prepare() says so
    _refuse_untrusted(folder, st)


def _refuse_untrusted(folder: Path, st: os.stat_result) -> None:
    fix = "pass dir= a folder of your own (chmod go-w, or mkdir -m 700)"
    if stat.S_ISLNK(st.st_mode):
        raise UsageError(
            f"checkpoint folder {folder} is a link, which could lead to a folder someone else "
            f"chose: {fix}"
        )
    if st.st_uid != os.geteuid() and st.st_uid != 0:
        raise UsageError(
            f"checkpoint folder {folder} belongs to another user (uid {st.st_uid}), who could "
            f"plant checkpoints there: {fix}"
        )
    if others_may_write(st) and not st.st_mode & stat.S_ISVTX:
        raise UsageError(
            f"checkpoint folder {folder} can be written by other users (mode "
            f"{stat.S_IMODE(st.st_mode):o}), who could plant checkpoints there: {fix}"
        )


def _make_dirs(folder: Path) -> None:
    """Create ``folder`` (and any missing parents) as 0700, each in a parent that only we may
    change. The creation is the check: one that already exists, or appears meanwhile (another
    user's, in a shared sticky folder), must be a folder of ours that only we may change, not a
    link (``lstat``)."""
    _check_trusted(folder.parent)  # else its owner could swap what we make in it
    try:
        os.mkdir(folder, 0o700)
    except FileNotFoundError:
        if folder.parent == folder or folder.parent.exists():
            raise  # its parent is there: nothing can be made in it (/proc)
        _make_dirs(folder.parent)
        _make_dirs(folder)
        return
    except FileExistsError:
        _refuse_untrusted(folder, os.lstat(folder))
        return
    if os.stat(folder).st_mode & 0o777 != 0o700:  # a umask that took the owner's bits
        os.chmod(folder, 0o700)


def prepare(folder: Path) -> Path:
    """``folder`` created (0700) and checked for writing: a clear error before training."""
    try:
        _make_dirs(folder)
        probe = folder / f".probe-{os.getpid()}"
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600))
        probe.unlink()
    except ValueError as e:  # a NUL in the name
        raise UsageError(f"checkpoint folder {folder!r} cannot be made: {e}") from None
    except OSError as e:
        if e.errno in _STORAGE_ERRNOS:
            raise files.storage_error("write", folder, e) from None
        where = Path(e.filename) if e.filename else folder
        shown = next((p for p in (folder, *folder.parents) if where == p), folder)
        raise UsageError(
            f"checkpoint folder {shown} is not writable ({e.strerror}): pass dir= a folder you "
            "can write, or set NBDIST_DATA_DIR"
        ) from None
    return folder
