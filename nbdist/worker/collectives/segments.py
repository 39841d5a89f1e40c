"""The shared-memory segments' files: named for the process that made them, and those whose
maker is gone removed.

A local group's rank 0 makes its segment (16-64 MiB) as a file in ``/dev/shm`` (else the temp
folder), every rank opens it by its path, and rank 0 unlinks it once every rank has it open or
gave up. A rank 0 killed in between leaves the file behind, and on a container's 64 MiB
``/dev/shm`` the next group finds no room and falls back to gloo. So the file's name says who
made it: ``nbdist-shm-PID.START.NS-XXXXXXXX``, the maker's pid, its start (clock ticks since
boot: a later process given the same pid is not it) and its pid namespace (a pid of another
namespace says nothing here). ``leftovers`` lists this user's segments whose maker is gone;
``remove`` takes one away, ``sweep`` all (``%nbdist gc``, and the fork server as it starts).

Never removed: a file whose maker runs, or whose name does not say who made it (older nbdist),
or that is not a plain file of this user's; nothing is followed through a symbolic link.
Light: no torch (the kernel's housekeeping imports it).
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

PREFIX = "nbdist-shm-"
_NAME = re.compile(re.escape(PREFIX) + r"(?P<pid>\d+)\.(?P<start>\d+)\.(?P<ns>\d+)-\w+")


@dataclass(frozen=True)
class Leftover:
    """A segment file whose maker (``pid``) is gone: ``bytes`` of memory it holds."""

    path: Path
    bytes: int
    pid: int


def folders() -> tuple[str, ...]:
    """Where segments are made, in order of preference (the temp folder as ``$TMPDIR`` says)."""
    return ("/dev/shm", tempfile.gettempdir())


def prefix() -> str:
    """The start of the name of a segment this process makes: who it is."""
    fields = _stat(os.getpid())
    return f"{PREFIX}{os.getpid()}.{fields[19] if fields else 0}.{_namespace()}-"


def leftovers() -> list[Leftover]:
    """This user's segments, in every folder, whose maker is gone."""
    found = []
    for folder in dict.fromkeys(folders()):
        try:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        try:
            names = sorted(n for n in os.listdir(fd) if n.startswith(PREFIX))
            found += [left for n in names if (left := _orphan(fd, folder, n)) is not None]
        except OSError:
            pass
        finally:
            os.close(fd)
    return found


def remove(path: Path) -> bool:
    """Remove the segment ``path`` if it is still a leftover (looked at again, through its
    folder's descriptor, the link itself); True when it went."""
    try:
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        if _orphan(fd, str(path.parent), path.name) is None:
            return False
        os.unlink(path.name, dir_fd=fd)  # a link's own name: never what it points to
        return True
    except FileNotFoundError:  # another sweep was first
        return False
    finally:
        os.close(fd)


def sweep() -> int:
    """Remove every leftover; the bytes freed. Never raises for a file it could not remove."""
    freed = 0
    for left in leftovers():
        try:
            freed += left.bytes if remove(left.path) else 0
        except OSError:
            continue
    return freed


def _orphan(fd: int, folder: str, name: str) -> Leftover | None:
    """The file ``name`` in the folder open as ``fd`` when it is a plain file of this user's,
    its name says who made it, in this pid namespace, and that maker is gone; else None."""
    m = _NAME.fullmatch(name)
    here = _namespace()
    if m is None or not here or int(m["ns"]) != here or m["start"] == "0":
        return None  # who made it is not known here: it stays
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        return None
    fields = _stat(int(m["pid"]))
    if fields is not None and fields[19] == m["start"] and fields[0] not in ("Z", "X"):
        return None  # its maker runs (a zombie has exited: only its parent has not reaped it)
    return Leftover(Path(folder, name), st.st_blocks * 512, int(m["pid"]))


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after its name (state first, start time 20th); None
    when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].decode().split()
    except (OSError, IndexError):
        return None


def _namespace() -> int:
    """This process's pid namespace (its inode); 0 where there is none to read."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0
