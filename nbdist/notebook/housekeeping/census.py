"""What the data folder holds, found by one walk: its size by kind, and the entries gc judges.

The data folder (``config.data_dir()``) holds::

    runs.sqlite (-wal, -shm)      the run store                              kind "runs"
    runs/<run id>/                a run's --profile trace                    kind "runs"
    checkpoints/<run key>/        a run's checkpoints (and <key>.earlier-*)  kind "checkpoints"
    profile/log/<cluster id>/     a cluster's engine logs                    kind "logs"
    profile/log/*.log, *.json     controller logs, hub states                kind "logs"
    profile/security/*.json       cluster files and connection files         kind "clusters"
    clusters/host-<pid>.*         sidebar hosts' records, sockets, leases    kind "clusters"
    keep/<cluster id>/            its ranks' states, kept for replacements   kind "clusters"

The walk never follows a link (what a link names is not the data folder's), skips what vanishes
under it, and, given a ``limit``, stops after that many entries and says it is partial: it runs
at every ``%nbdist status``.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

KINDS = ("checkpoints", "runs", "logs", "clusters", "other")
#: Folders deeper than this are not looked into (nbdist makes none deeper than 3).
MAX_DEPTH = 32


@dataclass(frozen=True)
class Entry:
    """A file or folder: its bytes (a folder's: all it holds) and its newest modification."""

    path: Path
    bytes: int
    mtime: float
    folder: bool = False

    @property
    def name(self) -> str:
        return self.path.name


@dataclass
class Census:
    """The data folder ``root`` as one walk found it."""

    root: Path
    sizes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    checkpoints: list[Entry] = field(default_factory=list)  # checkpoints/<key>/
    profiles: list[Entry] = field(default_factory=list)  # runs/<id>/
    log_dirs: list[Entry] = field(default_factory=list)  # profile/log/<cluster id>/
    logs: list[Entry] = field(default_factory=list)  # every *.log anywhere under profile/log
    loose: list[Entry] = field(default_factory=list)  # files in profile/log, security, clusters
    kept: list[Entry] = field(default_factory=list)  # keep/<cluster id>/
    store: list[Entry] = field(default_factory=list)  # runs.sqlite and its WAL files
    complete: bool = True

    @property
    def total(self) -> int:
        return sum(self.sizes.values())


class _Budget:
    def __init__(self, limit: int | None):
        self.left = limit

    def take(self) -> bool:
        if self.left is None:
            return True
        self.left -= 1
        return self.left >= 0


def _stat(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path, follow_symlinks=False)
    except OSError:
        return None


def _children(path: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as it:
            return [e for e in it if not e.is_symlink()]
    except OSError:
        return []


def _tree(
    path: Path, budget: _Budget, logs: list[Entry] | None = None, depth: int = 0
) -> Entry | None:
    """``path`` (file or folder) as an Entry, folders summed (``MAX_DEPTH`` levels down at
    most); its ``*.log`` files into ``logs``."""
    st = _stat(path)
    if st is None or not budget.take():
        return None
    if not stat.S_ISDIR(st.st_mode):
        entry = Entry(path, st.st_size, st.st_mtime)
        if logs is not None and path.name.endswith(".log"):
            logs.append(entry)
        return entry
    size, newest = 0, st.st_mtime
    for child in _children(path) if depth < MAX_DEPTH else ():
        sub = _tree(Path(child.path), budget, logs, depth + 1)
        if sub is not None:
            size, newest = size + sub.bytes, max(newest, sub.mtime)
    return Entry(path, size, newest, folder=True)


def take(root: Path, limit: int | None = None) -> Census:
    """The census of the data folder ``root`` (an empty one when it does not exist); with a
    ``limit``, at most that many entries are looked at."""
    census, budget = Census(root), _Budget(limit)

    def add(kind: str, entry: Entry | None, into: list[Entry] | None = None) -> None:
        if entry is not None:
            census.sizes[kind] += entry.bytes
            if into is not None:
                into.append(entry)

    for child in _children(root):
        path = Path(child.path)
        if child.name == "checkpoints" and child.is_dir():
            for sub in _children(path):
                add("checkpoints", _tree(Path(sub.path), budget), census.checkpoints)
        elif child.name == "runs" and child.is_dir():
            for sub in _children(path):
                add("runs", _tree(Path(sub.path), budget), census.profiles)
        elif child.name.startswith("runs.sqlite"):
            add("runs", _tree(path, budget), census.store)
        elif child.name == "profile" and child.is_dir():
            _profile(path, budget, census, add)
        elif child.name == "clusters" and child.is_dir():
            for sub in _children(path):
                add("clusters", _tree(Path(sub.path), budget), census.loose)
        elif child.name == "keep" and child.is_dir():
            for sub in _children(path):
                add("clusters", _tree(Path(sub.path), budget), census.kept)
        else:
            add("other", _tree(path, budget))
    census.complete = budget.left is None or budget.left >= 0
    return census


def _profile(path: Path, budget: _Budget, census: Census, add) -> None:
    for child in _children(path):
        sub = Path(child.path)
        if child.name == "log" and child.is_dir():
            for item in _children(sub):
                entry = _tree(Path(item.path), budget, census.logs)
                add("logs", entry, census.log_dirs if item.is_dir() else census.loose)
        elif child.name == "security" and child.is_dir():
            for item in _children(sub):
                add("clusters", _tree(Path(item.path), budget), census.loose)
        else:
            add("other", _tree(sub, budget))


def human(n: float) -> str:
    """Bytes as people write them: 0 B, 980 B, 12 kB, 3.4 MB, 1.2 GB."""
    if abs(n) < 1000:
        return f"{int(n)} B"
    for unit in ("kB", "MB", "GB", "TB"):
        n /= 1000
        if abs(n) < 1000 or unit == "TB":
            break
    return f"{n:.1f} {unit}" if abs(n) < 10 else f"{n:.0f} {unit}"
