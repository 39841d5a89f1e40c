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

A folder belongs to one run at a time: ``run.json`` names the run that writes there (its id, kept
across nbdist's restarts and replays). A new run under a name that holds an earlier run's
checkpoints starts afresh, and those move aside to ``<name>.earlier-<time>`` beside it (nothing
is deleted), unless the person asked to resume (``--resume``): ``claim``.

A folder given as ``dir=`` must be the person's own, like the data folder: one that others may
write (without the sticky bit) could have checkpoints planted or swapped in. Pruning keeps the
newest ``keep`` checkpoints that verify (size and SHA-256, each file hashed once per process),
so a corrupt newer file never costs a good older one.

Loaded with ``torch.load(weights_only=True)``: a checkpoint holds tensors and plain values only
(``contents.check_safe``), so a file planted in the folder cannot run code.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import socket
import stat
import time
import warnings
from pathlib import Path

from ...errors import CheckpointWriteError, UsageError

FORMAT = 2  # payloads hold only what a weights-only load accepts
#: The first torch whose weights-only loader has no known way to run code (CVE-2025-32434).
SAFE_TORCH = "2.6"
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
        base = Path(dir).expanduser()
    except (TypeError, RuntimeError) as e:  # not a path; ~user with no such user
        raise UsageError(
            f"nbdist: dir= must be a folder's path, not the {type(dir).__name__} "
            f"{repr(dir)[:60]} ({e})"
        ) from None
    for folder in (base, base / run):
        _check_trusted(folder)
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
    fix = "pass dir= a folder of your own (chmod go-w, or mkdir -m 700)"
    if st.st_uid != os.geteuid() and st.st_uid != 0:
        raise UsageError(
            f"checkpoint folder {folder} belongs to another user (uid {st.st_uid}), who could "
            f"plant checkpoints there: {fix}"
        )
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise UsageError(
            f"checkpoint folder {folder} can be written by other users (mode "
            f"{stat.S_IMODE(st.st_mode):o}), who could plant checkpoints there: {fix}"
        )


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
        _verified[folder / f"{name}.pt"] = _stamp(folder / f"{name}.pt")  # hashed as written
        try:
            _write_atomic(folder / f"{name}.json", json.dumps(marker).encode())
        except BaseException:
            (folder / f"{name}.pt").unlink(missing_ok=True)  # no marker: it would never count
            raise
    except OSError as e:
        raise _storage_error(f"write {name}.pt", folder, e) from None


def claim(folder: Path, run_id: str, resume: bool) -> str:
    """Make the prepared ``folder`` the checkpoints' folder of run ``run_id`` (the same id
    across the run's restarts and replays); the line to show the person, or "".

    A folder another run wrote into is that run's: unless ``resume``, its checkpoints move
    aside to ``<name>.earlier-<time>`` beside it and this run starts afresh."""
    if _owner(folder) == run_id:
        return ""
    done = complete(folder)
    if done and not resume:
        aside = _aside(folder)
        try:
            os.rename(folder, aside)
        except OSError as e:
            raise UsageError(
                f"nbdist: {folder} holds an earlier run's checkpoints, which could not be moved "
                f"aside ({e.strerror}): pass run= another name, or move them yourself"
            ) from None
        prepare(folder)
    try:
        _write_atomic(folder / _CLAIM, json.dumps({"run": run_id, "at": time.time()}).encode())
    except OSError as e:
        raise _storage_error(f"write {_CLAIM}", folder, e) from None
    if done and not resume:
        return (
            f"nbdist: run {folder.name!r} already had checkpoints ({done[0][0] + 1} steps done) "
            f"from an earlier run: this run starts afresh, and those moved to {aside}; to "
            "continue that run instead, run the cell again with --resume"
        )
    if resume and not done:
        return f"nbdist: --resume: run {folder.name!r} has no checkpoint yet: it starts afresh"
    return ""


_CLAIM = "run.json"  # which run writes into the folder


def _owner(folder: Path) -> str | None:
    try:
        return json.loads((folder / _CLAIM).read_text()).get("run")
    except (OSError, ValueError, AttributeError):
        return None


def _aside(folder: Path) -> Path:
    """A free name beside ``folder`` for an earlier run's checkpoints."""
    base = f"{folder.name}.earlier-{time.strftime('%Y%m%d-%H%M%S')}"
    for n in range(1, 1000):
        aside = folder.with_name(base if n == 1 else f"{base}-{n}")
        if not aside.exists():
            return aside
    raise UsageError(f"nbdist: too many earlier runs beside {folder}: run %nbdist gc")


def complete(folder: Path) -> list[tuple[int, Path]]:
    """The checkpoints with a marker, as (step, data file), newest first."""
    found = []
    for f in folder.glob("step-*.pt"):
        m = _NAME.fullmatch(f.name)
        if m and f.with_suffix(".json").exists():
            found.append((int(m.group(1)), f))
    return sorted(found, key=lambda sf: sf[0], reverse=True)


def prune(folder: Path, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints that verify (at least 2); remove older ones, and
    what a killed writer left behind: data older than the newest checkpoint without its
    marker, and temporary files of processes on this host that are gone. A checkpoint that
    does not verify is not counted: restore skips it, saying so, and it goes once it is older
    than the ones kept."""
    done = complete(folder)
    good = 0
    for _, path in done:
        if good >= max(2, keep):
            path.with_suffix(".json").unlink(missing_ok=True)
            path.unlink(missing_ok=True)
        elif _verifies(path):
            good += 1
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


#: Files that verified, as (size, mtime_ns) when they did: each is hashed once per process.
_verified: dict[Path, tuple[int, int]] = {}


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def _read_verified(path: Path) -> bytes:
    """``path``'s data when its size and SHA-256 match its marker; a ValueError otherwise."""
    marker = json.loads(path.with_suffix(".json").read_text())
    data = path.read_bytes()
    if len(data) != marker["bytes"] or hashlib.sha256(data).hexdigest() != marker["sha256"]:
        raise ValueError("checksum mismatch")
    _verified[path] = _stamp(path)
    return data


def _verifies(path: Path) -> bool:
    try:
        if _verified.get(path) == _stamp(path):
            return True
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


def _refusal(e: Exception) -> str:
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
    for _, path in complete(folder):
        try:
            data = _read_verified(path)
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
