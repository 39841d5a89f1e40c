"""Checkpoint files: where a run's checkpoints live, how one is written, and which one loads.

Layout: ``<dir>/<run>/step-00000120.pt`` and its marker ``step-00000120.json`` (size and
SHA-256). Each run has a folder of its own, so runs sharing a ``dir`` never load or prune each
other's checkpoints. The number is the index of the last step done, padded to 8 digits and as
wide as it needs beyond; names are read as numbers and sorted as numbers.

Written privately and atomically: folders are created 0700 and files 0600 (a checkpoint holds
the model), the data goes to a temporary file that is synced and renamed, then the marker the
same way. A checkpoint counts only when its marker exists and matches, so a crash mid-write is
never loaded. A write that fails removes its temporary file and raises ``CheckpointWriteError``
naming the folder and the cause: the storage's fault, which ``--restarts`` retries.

Loaded with ``torch.load(weights_only=True)``: a checkpoint holds tensors and plain values only,
so a file planted in the folder cannot run code. ``check_safe`` refuses anything else when it is
saved, not when it would be loaded.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import io
import json
import os
import re
import socket
import warnings
from pathlib import Path
from typing import Any

from ...errors import CheckpointWriteError, UsageError

FORMAT = 2  # payloads hold only what a weights-only load accepts
_NAME = re.compile(r"step-([0-9]+)\.pt")  # names are matched whole (fullmatch)
_TEMP = re.compile(r"\.step-[0-9]+\.(pt|json)\.(?P<host>.+)\.(?P<pid>[0-9]+)\.tmp")
_RUN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
#: Causes that are the storage's, not the person's: a write failing so is retried.
_STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG, errno.ESTALE}


def stem(step: int) -> str:
    """The file name (without suffix) of the checkpoint of ``step``."""
    return f"step-{step:08d}"


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
        return Path(dir).expanduser() / run
    except (TypeError, RuntimeError) as e:  # not a path; ~user with no such user
        raise UsageError(
            f"nbdist: dir= must be a folder's path, not the {type(dir).__name__} "
            f"{repr(dir)[:60]} ({e})"
        ) from None


def _make_dirs(folder: Path) -> None:
    """Create ``folder`` and any missing parents as 0700 (existing ones are left as they are)."""
    missing = []
    p = folder
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            continue  # made meanwhile by someone else: not ours to change
        if os.stat(d).st_mode & 0o777 != 0o700:  # a umask that took the owner's bits
            os.chmod(d, 0o700)


def _storage_error(what: str, folder: Path, e: OSError) -> CheckpointWriteError:
    cause = e.strerror or type(e).__name__
    return CheckpointWriteError(
        f"nbdist.checkpoint: could not {what} in {folder} ({cause}): free space there or pass "
        "dir= another folder; --restarts retries the cell"
    )


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
            raise _storage_error("write", folder, e) from None
        where = Path(e.filename) if e.filename else folder
        shown = next((p for p in (folder, *folder.parents) if where == p), folder)
        raise UsageError(
            f"checkpoint folder {shown} is not writable ({e.strerror}): pass dir= a folder you "
            "can write, or set NBDIST_DATA_DIR"
        ) from None
    return folder


def _temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")


def _write_atomic(path: Path, data: bytes) -> None:
    """``data`` into ``path``, whole or not at all: a private temporary file, synced, renamed."""
    tmp = _temp_name(path)
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
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def write(folder: Path, step: int, data: bytes) -> None:
    """The checkpoint of ``step`` (its data, then its marker) into ``folder``."""
    name = stem(step)
    marker = {"step": step, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    try:
        _write_atomic(folder / f"{name}.pt", data)
        try:
            _write_atomic(folder / f"{name}.json", json.dumps(marker).encode())
        except BaseException:
            (folder / f"{name}.pt").unlink(missing_ok=True)  # no marker: it would never count
            raise
    except OSError as e:
        raise _storage_error(f"write {name}.pt", folder, e) from None


def complete(folder: Path) -> list[tuple[int, Path]]:
    """The checkpoints with a marker, as (step, data file), newest first."""
    found = []
    for f in folder.glob("step-*.pt"):
        m = _NAME.fullmatch(f.name)
        if m and f.with_suffix(".json").exists():
            found.append((int(m.group(1)), f))
    return sorted(found, key=lambda sf: sf[0], reverse=True)


def prune(folder: Path, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints (at least 2); remove older ones, and what a killed
    writer left behind: data older than the newest checkpoint without its marker, and
    temporary files of processes on this host that are gone."""
    done = complete(folder)
    for _, old in done[max(2, keep) :]:
        old.with_suffix(".json").unlink(missing_ok=True)
        old.unlink(missing_ok=True)
    newest = done[0][0] if done else -1
    for f in folder.glob("step-*.pt"):
        m = _NAME.fullmatch(f.name)
        if m and int(m.group(1)) < newest and not f.with_suffix(".json").exists():
            f.unlink(missing_ok=True)
    here = socket.gethostname()
    for f in folder.glob(".step-*.tmp"):
        m = _TEMP.fullmatch(f.name)
        if m and m["host"] == here and not _alive(int(m["pid"])):
            f.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _refusal(e: Exception) -> str:
    """torch's paragraph on a refused load, as one line: the object it would not build."""
    lines = [s.strip() for s in str(e).splitlines() if s.strip()]
    detail = [s for s in lines[1:] if not s.startswith(("Check the documentation", "Please file"))]
    return "refused to load: " + (" ".join(detail) or (lines[0] if lines else repr(e)))[:200]


def load_latest(folder: Path) -> tuple[dict | None, list[str]]:
    """The newest checkpoint that verifies and loads safely, and what was skipped (and why)."""
    import pickle

    import torch

    skipped: list[str] = []
    if not folder.is_dir():
        return None, skipped
    for _, path in complete(folder):
        try:
            marker = json.loads(path.with_suffix(".json").read_text())
            data = path.read_bytes()
            if len(data) != marker["bytes"] or hashlib.sha256(data).hexdigest() != marker["sha256"]:
                raise ValueError("checksum mismatch")
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    payload = torch.load(io.BytesIO(data), weights_only=True)
            except pickle.UnpicklingError as e:
                raise ValueError(_refusal(e)) from None
            if not isinstance(payload, dict) or payload.get("format") != FORMAT:
                raise ValueError("not a checkpoint of this nbdist version")
            return payload, skipped
        except Exception as e:
            skipped.append(f"{path.name}: {' '.join(str(e).split())[:300]}")  # one line
    return None, skipped


# -- what a checkpoint may hold -------------------------------------------------------------


@functools.cache
def _leaf_types() -> frozenset[type]:
    """The exact types a weights-only load rebuilds by default that hold nothing else."""
    import torch

    plain = (str, bytes, bytearray, int, float, complex, bool, type(None))
    return frozenset(
        (*plain, torch.Tensor, torch.nn.Parameter, torch.Size, torch.dtype, torch.device)
    )


def _children(value: Any, leaves: frozenset[type]) -> list[tuple[Any, Any]] | None:
    """The parts of a container a weights-only load rebuilds that are not leaves, as (key or
    index, part), keys included; None when ``value`` is no such container."""
    from collections import OrderedDict

    if type(value) in (dict, OrderedDict):
        keys = [(k, k) for k in value if type(k) not in leaves]
        return keys + [(k, v) for k, v in value.items() if type(v) not in leaves]
    if type(value) in (list, tuple, set):
        return [(i, v) for i, v in enumerate(value) if type(v) not in leaves]
    return None


def _fix(name: str, value: Any) -> str:
    kind = type(value)
    if hasattr(value, "state_dict"):
        return f"pass {name}.state_dict()"
    if kind.__module__ == "numpy" and kind.__name__ == "ndarray":
        return f"pass torch.from_numpy({name}) or {name}.tolist()"
    if kind.__module__ == "numpy":
        return f"pass {name}.item()"
    return "pass its data as tensors and plain values (dicts, lists, numbers, strings)"


def check_safe(name: str, value: Any) -> None:
    """Refuse ``value`` (state ``name``) now if a weights-only load could not rebuild it later:
    one line naming the object and the fix."""
    leaves = _leaf_types()
    todo: list[tuple[tuple, Any]] = [((), value)]
    seen: set[int] = set()
    while todo:
        path, v = todo.pop()
        if type(v) in leaves:
            continue
        parts = _children(v, leaves)
        if parts is not None:
            if id(v) not in seen:  # a container that holds itself is walked once
                seen.add(id(v))
                todo.extend(((*path, k), c) for k, c in parts)
            continue
        where = f"state {name!r}" + (" at " + "".join(f"[{k!r}]" for k in path) if path else "")
        kind = f"{type(v).__module__}.{type(v).__qualname__}"
        raise UsageError(
            f"nbdist.checkpoint: {where} is a {kind}, which a checkpoint cannot hold safely "
            f"(loading it could run code): {_fix(name if not path else 'it', v)}"
        )
