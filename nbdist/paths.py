"""Paths a person types (``~/data``, ``~alice/runs``), made ``Path``s, or one line saying why not;
and whether others may write a folder.

``Path.expanduser`` raises a RuntimeError for ``~name`` when there is no user ``name``: typed
input must not reach the notebook as that traceback.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from .errors import UsageError


def expand(path: str | os.PathLike, what: str) -> Path:
    """``path`` with ``~`` expanded; a UsageError naming ``what`` when it cannot be."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        raise UsageError(
            f"{what} {os.fspath(path)!r:.80} starts with '~' but names no user's home: "
            "give the full path"
        ) from None


def others_may_write(st: os.stat_result) -> bool:
    """Whether users other than this one may write the folder ``st`` describes: it is world
    writable, or group writable by a group with anyone else in it. A user-private group (named
    after this user, no one else in it: what systems with umask 002 give each user) does not
    count, so a person's own 775 project folder is theirs."""
    if st.st_mode & 0o002:
        return True
    return bool(st.st_mode & 0o020) and not _private_group(st.st_gid)


@functools.lru_cache(maxsize=8)
def _private_group(gid: int) -> bool:
    import grp
    import pwd

    try:
        me = pwd.getpwuid(os.geteuid())
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    if group.gr_name != me.pw_name or set(group.gr_mem) - {me.pw_name}:
        return False
    return all(p.pw_uid == me.pw_uid for p in pwd.getpwall() if p.pw_gid == gid)
