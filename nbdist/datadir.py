"""nbdist's data folder (``config.data_dir()``: ``$NBDIST_DATA_DIR`` or ``~/.local/share/nbdist``).

It holds the run store, the records and control sockets of sidebar-hosted clusters, the
ipyparallel profile (connection keys) and checkpoints, so it must be yours alone: a folder
another user owns or may write could hold records planted there. ``ensure()`` makes it (mode
0700) when it is missing; ``check()`` makes nothing (for readers: the server's GETs). Both refuse
a folder that is not fit, in one line that names it and the fix. Neither changes the mode of a
folder nbdist did not create.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from . import config
from .errors import UsageError
from .paths import others_may_write

_FIX = f"set {config.DATA_DIR_ENV} to a folder of your own"
_EFFECTIVE = os.access in os.supports_effective_ids


def _unfit(path: Path, st: os.stat_result) -> str | None:
    """Why the existing ``path`` (stat ``st``) cannot be nbdist's data folder; None if it can."""
    if not stat.S_ISDIR(st.st_mode):
        return f"nbdist's data folder {path} is not a folder: {_FIX}"
    if st.st_uid != os.geteuid():
        return (
            f"nbdist's data folder {path} belongs to another user (uid {st.st_uid}), so records "
            f"there could be planted: {_FIX}"
        )
    if others_may_write(st):
        return (
            f"nbdist's data folder {path} can be written by other users (mode "
            f"{stat.S_IMODE(st.st_mode):o}): chmod go-w {path}, or {_FIX}"
        )
    if not os.access(path, os.R_OK | os.W_OK | os.X_OK, effective_ids=_EFFECTIVE):
        return (
            f"nbdist's data folder {path} is not writable by you (mode "
            f"{stat.S_IMODE(st.st_mode):o}): chmod u+rwx {path}, or {_FIX}"
        )
    return None


def check(path: Path | None = None) -> Path | None:
    """The data folder (default ``config.data_dir()``) if it exists and is fit, None if it does
    not exist yet; a one-line UsageError when it is not fit. Creates nothing."""
    path = config.data_dir() if path is None else path
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise UsageError(
            f"nbdist's data folder {path} cannot be read ({e.strerror}): {_FIX}"
        ) from None
    why = _unfit(path, st)
    if why:
        raise UsageError(why)
    return path


def ensure(path: Path | None = None) -> Path:
    """The data folder (default ``config.data_dir()``), made with mode 0700 if missing; a
    one-line UsageError when it cannot be made or is not fit (see ``check``)."""
    path = config.data_dir() if path is None else path
    if check(path) is not None:
        return path
    try:
        private_dir(path)
    except OSError as e:
        raise UsageError(
            f"cannot create nbdist's data folder {path} ({e.strerror or e}): {_FIX}"
        ) from None
    check(path)  # made by someone else a moment ago: theirs must be fit too
    return path


def private_dir(path: Path) -> Path:
    """``path``, a folder inside the data folder: made with mode 0700 when missing (its mode is
    nbdist's to set then), left as it is when it exists. Missing parents are made too."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if not path.is_dir():
            raise UsageError(
                f"{path} is in nbdist's data folder but is not a folder: remove it"
            ) from None
        return path
    os.chmod(path, 0o700)  # ours: the umask does not decide
    return path
