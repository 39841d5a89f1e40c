"""Which run a checkpoint folder belongs to: ``claim``, ``run_of``.

A folder belongs to one run at a time: ``run.json`` (written atomically, 0600) names the run
that writes there (its id, kept across nbdist's restarts and replays, which its checkpoint
events carry too: a tracker sends a folder only while it is that run's, ``snapshot``). A new
run under a name that holds an earlier run's checkpoints (of either format: ``files.complete``)
starts afresh, and those move aside to ``<name>.earlier-<time>`` beside it (nothing is
deleted), unless the person asked to resume (``--resume``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ...errors import UsageError
from . import files, folders

RECORD = "run.json"  # which run writes into the folder


def claim(folder: Path, run_id: str, resume: bool) -> str:
    """Make the prepared ``folder`` the checkpoints' folder of run ``run_id`` (the same id
    across the run's restarts and replays); the line to show the person, or "".

    A folder another run wrote into is that run's: unless ``resume``, its checkpoints move
    aside to ``<name>.earlier-<time>`` beside it and this run starts afresh."""
    if _owner(folder) == run_id:
        return ""
    done = files.complete(folder)
    if done and not resume:
        aside = _aside(folder)
        try:
            os.rename(folder, aside)
        except OSError as e:
            raise UsageError(
                f"nbdist: {folder} holds an earlier run's checkpoints, which could not be moved "
                f"aside ({e.strerror}): pass run= another name, or move them yourself"
            ) from None
        folders.prepare(folder)
    try:
        record = json.dumps({"run": run_id, "at": time.time()}).encode()
        files.write_atomic(folder / RECORD, record)
    except OSError as e:
        raise files.storage_error(f"write {RECORD}", folder, e) from None
    if done and not resume:
        return (
            f"nbdist: run {folder.name!r} already had checkpoints ({done[0][0] + 1} steps done) "
            f"from an earlier run: this run starts afresh, and those moved to {aside}; to "
            "continue that run instead, run the cell again with --resume"
        )
    if resume and not done:
        return f"nbdist: --resume: run {folder.name!r} has no checkpoint yet: it starts afresh"
    return ""


def _owner(folder: Path) -> str | None:
    try:
        return run_of((folder / RECORD).read_bytes())
    except OSError:
        return None


def run_of(record: bytes | None) -> str | None:
    """The run a folder's record (``RECORD``'s bytes) names; None for none, or a bad record."""
    try:
        run = json.loads(record or b"null").get("run")
    except (ValueError, AttributeError):
        return None
    return run if isinstance(run, str) else None


def _aside(folder: Path) -> Path:
    """A free name beside ``folder`` for an earlier run's checkpoints."""
    base = f"{folder.name}.earlier-{time.strftime('%Y%m%d-%H%M%S')}"
    for n in range(1, 1000):
        aside = folder.with_name(base if n == 1 else f"{base}-{n}")
        if not aside.exists():
            return aside
    raise UsageError(f"nbdist: too many earlier runs beside {folder}: run %nbdist gc")
