"""Checkpoint files: where a run's checkpoints live, how one is written, and which one loads.

Layout: ``<dir>/<run>/step-00000120.pt`` (gathered: one file, written by rank 0) or
``step-00000120.dcp/`` (sharded: a folder of every rank's shards, ``sharded``), and its marker
``step-00000120.json`` (the size and SHA-256 of each file). Each run has a folder of its own, so
runs sharing a ``dir`` never load or prune each other's checkpoints. The number is the index of
the last step done, padded to 8 digits and as wide as it needs beyond; names are read as numbers
and sorted as numbers; the newest checkpoint that verifies wins, whatever its format.

Written privately and atomically: folders are created 0700 and files 0600 (a checkpoint holds
the model), the data goes to a temporary file (or folder) that is synced and renamed, then the
marker the same way. A checkpoint counts only when its marker exists and matches, so a crash
mid-write is never loaded. A write that fails removes its temporary file and raises
``CheckpointWriteError`` naming the folder and the cause: the storage's fault, which
``--restarts`` retries. Where the folder is, made safely: ``folders``; which run it belongs
to: ``owner``.

Pruning keeps the
newest ``keep`` checkpoints that verify (size and SHA-256, each file hashed once per process),
so a corrupt newer file never costs a good older one.

Loaded with ``torch.load(weights_only=True)``: a checkpoint holds tensors and plain values only
(``contents.check_safe``), and a sharded one's metadata only DCP's own records
(``contents.load_metadata``), so a file planted in the folder cannot run code.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import socket
import stat
import warnings
from collections import OrderedDict
from pathlib import Path

from ...errors import CheckpointWriteError, UsageError
from . import contents

FORMAT = 2  # payloads hold only what a weights-only load accepts
#: The first torch whose weights-only loader has no known way to run code (CVE-2025-32434).
SAFE_TORCH = "2.6"
_NAME = re.compile(r"step-([0-9]+)\.(pt|dcp)")  # names are matched whole (fullmatch)
#: A writer's temporary file or folder, or a snapshot being sent (``snapshot``): its host, pid.
_TEMP = re.compile(r"\.(step-[0-9]+\.(pt|json|dcp)|upload)\.(?P<host>.+)\.(?P<pid>[0-9]+)\.tmp")
_SHARD = re.compile(r"\.?[A-Za-z0-9_][A-Za-z0-9_.]{0,99}")  # a file DCP writes


def stem(step: int) -> str:
    """The file name (without suffix) of the checkpoint of ``step``."""
    return f"step-{step:08d}"


def storage_error(what: str, folder: Path, e: OSError) -> CheckpointWriteError:
    cause = e.strerror or type(e).__name__
    return CheckpointWriteError(
        f"nbdist.checkpoint: could not {what} in {folder} ({cause}): free space there or pass "
        "dir= another folder; --restarts retries the cell"
    )


def temp_name(path: Path) -> Path:
    """The temporary name ``path`` is written under, by this process on this host."""
    return path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")


def write_atomic(path: Path, data: bytes) -> None:
    """``data`` into ``path``, whole or not at all: a private temporary file, synced, renamed."""
    tmp = temp_name(path)
    tmp.unlink(missing_ok=True)  # left by a killed process that had our pid
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # exactly 0600, whatever the umask
        with os.fdopen(fd, "wb") as f:
            fd = -1
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    sync_folder(path.parent)


def sync_folder(folder: Path) -> None:
    """Make what was renamed into ``folder`` durable (its directory entries synced)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(folder: Path, step: int, data: bytes) -> None:
    """The checkpoint of ``step`` (its data, then its marker) into ``folder``."""
    name = stem(step)
    marker = {"step": step, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    try:
        remove(folder / f"{name}.dcp")  # a sharded checkpoint of this step: replaced
        write_atomic(folder / f"{name}.pt", data)
        trust(folder, folder / f"{name}.pt")  # hashed as written
        try:
            write_atomic(folder / f"{name}.json", json.dumps(marker).encode())
        except BaseException:
            (folder / f"{name}.pt").unlink(missing_ok=True)  # no marker: it would never count
            raise
    except OSError as e:
        raise storage_error(f"write {name}.pt", folder, e) from None


def complete(folder: Path) -> list[tuple[int, Path]]:
    """The checkpoints with a marker, as (step, data file or folder), newest first."""
    try:
        names = os.listdir(folder)
    except OSError:  # none there, or not a folder we can list
        return []
    return [(step, folder / name) for step, name in marked(names)]


def marked(names: list[str]) -> list[tuple[int, str]]:
    """The checkpoints among ``names`` (a folder's entries) whose marker is among them too, as
    (step, name of the data file or folder), newest first."""
    there = set(names)
    found = [
        (int(m.group(1)), n) for n in there if (m := _NAME.fullmatch(n)) and marker_name(n) in there
    ]
    return sorted(found, key=lambda sn: sn[0], reverse=True)


def marker_name(name: str) -> str:
    """The name of the marker of the checkpoint whose data is ``name``."""
    return name.rpartition(".")[0] + ".json"


def remove(path: Path) -> None:
    """``path`` gone, a file or a folder (a sharded checkpoint) alike."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def prune(folder: Path, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints that verify (at least 2); remove older ones, and
    what a killed writer left behind: data older than the newest checkpoint without its
    marker, and temporary files of processes on this host that are gone. A checkpoint that
    does not verify is not counted: restore skips it, saying so, and it goes once it is older
    than the ones kept."""
    done = complete(folder)
    good: set[Path] = set()
    for _, path in done:
        if len(good) >= max(2, keep):
            path.with_suffix(".json").unlink(missing_ok=True)
            remove(path)
        elif _verifies(path):
            good.add(path)
    known = _known(folder)  # only the files of the checkpoints kept are remembered
    for f in [f for f in known if f not in good and f.parent not in good]:
        del known[f]
    newest = done[0][0] if done else -1
    for f in folder.glob("step-*"):
        m = _NAME.fullmatch(f.name)
        if m and int(m.group(1)) < newest and not f.with_suffix(".json").exists():
            remove(f)
    here = socket.gethostname()
    for f in folder.glob(".*.tmp"):
        m = _TEMP.fullmatch(f.name)
        if m and m["host"] == here and not _alive(int(m["pid"])):
            remove(f)


def digest(path: Path) -> tuple[int, str]:
    """``path``'s size and SHA-256, read a MiB at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return path.stat().st_size, h.hexdigest()


#: Files that verified, as (size, mtime_ns) when they did, by run folder: each is hashed once
#: per process. Bounded over a long night: a folder keeps the files of the checkpoints its last
#: prune kept, and only the ``_FOLDERS`` folders used last are remembered.
_verified: OrderedDict[Path, dict[Path, tuple[int, int]]] = OrderedDict()
_FOLDERS = 16


def _known(folder: Path) -> dict[Path, tuple[int, int]]:
    """The files of run folder ``folder`` that verified; it is now the one used last."""
    known = _verified.setdefault(folder, {})
    _verified.move_to_end(folder)
    if len(_verified) > _FOLDERS:
        _verified.popitem(last=False)
    return known


def trust(folder: Path, path: Path) -> None:
    """Count ``path`` (in run folder ``folder``) as verified until it changes: its writer
    hashed it as it wrote it."""
    _known(folder)[path] = _stamp(path)


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def _read_verified(path: Path) -> bytes:
    """``path``'s data when its size and SHA-256 match its marker; a ValueError otherwise."""
    marker = json.loads(path.with_suffix(".json").read_text())
    data = path.read_bytes()
    if len(data) != marker["bytes"] or hashlib.sha256(data).hexdigest() != marker["sha256"]:
        raise ValueError("checksum mismatch")
    trust(path.parent, path)
    return data


def _verify_folder(path: Path) -> dict:
    """The marker of the sharded checkpoint ``path`` once every file in it is one it lists,
    of the size and SHA-256 it lists; a ValueError otherwise."""
    marker = json.loads(path.with_suffix(".json").read_text())
    listed = marker.get("files") if marker.get("format") == "dcp" else None
    if not isinstance(listed, dict) or not all(_SHARD.fullmatch(n) for n in listed):
        raise ValueError("its marker is not a sharded checkpoint's")
    if {p.name for p in path.iterdir()} != set(listed):
        raise ValueError("its files are not the ones its marker lists")
    known = _known(path.parent)
    for name, (size, sha) in listed.items():
        f = path / name
        if known.get(f) == _stamp(f):
            continue
        if not stat.S_ISREG(os.lstat(f).st_mode) or digest(f) != (size, sha):
            raise ValueError(f"checksum mismatch in {name}")
        known[f] = _stamp(f)
    return marker


def _verifies(path: Path) -> bool:
    try:
        if path.suffix == ".dcp":
            _verify_folder(path)
        elif _known(path.parent).get(path) != _stamp(path):
            _read_verified(path)
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def refusal(e: Exception) -> str:
    """torch's paragraph on a refused load, as one line: the object it would not build."""
    lines = [s.strip() for s in str(e).splitlines() if s.strip()]
    detail = [s for s in lines[1:] if not s.startswith(("Check the documentation", "Please file"))]
    return "refused to load: " + (" ".join(detail) or (lines[0] if lines else repr(e)))[:200]


def load_latest(folder: Path) -> tuple[dict | None, list[str]]:
    """The newest checkpoint that verifies and loads safely, and what was skipped (and why)."""
    import pickle

    import torch

    if torch.__version__ < SAFE_TORCH:
        raise UsageError(
            f"nbdist.restore: torch {torch.__version__}'s weights-only loader has known ways to "
            f"run code from a file (CVE-2025-32434): upgrade to torch>={SAFE_TORCH} to load "
            "checkpoints"
        )
    skipped: list[str] = []
    if not folder.is_dir():
        return None, skipped
    for step, path in complete(folder):
        try:
            if path.suffix == ".dcp":  # every rank loads its part: say where, and what it holds
                marker = _verify_folder(path)
                if marker.get("step") != step:
                    raise ValueError(f"its marker is step {marker.get('step')}'s")
                contents.load_metadata(path / ".metadata")
                return {"format": "dcp", "step": step, "path": str(path), **marker}, skipped
            data = _read_verified(path)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    payload = torch.load(io.BytesIO(data), weights_only=True)
            except pickle.UnpicklingError as e:
                raise ValueError(refusal(e)) from None
            if not isinstance(payload, dict) or payload.get("format") != FORMAT:
                raise ValueError("not a checkpoint of this nbdist version")
            return payload, skipped
        except Exception as e:
            skipped.append(f"{path.name}: {' '.join(str(e).split())[:300]}")  # one line
    return None, skipped
