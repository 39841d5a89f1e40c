"""Checkpoints: ``nbdist.checkpoint(step, every=K, **state)`` and ``nbdist.restore(**state)``.

Where they live: rank 0 writes them, on rank 0's host, into ``dir`` (default: the engine's
``$NBDIST_DATA_DIR/checkpoints/<run>``, one folder per run of a cell, kept across nbdist's
automatic restarts). ``restore`` reads them on rank 0 only and broadcasts the state to every rank
over the process group, so engines on other hosts need no access to the files. Point ``dir`` at
a shared file system if rank 0's host itself may be lost, or to resume across cell runs.

On disk: ``step-00000120.pt`` plus its marker ``step-00000120.json`` (size and SHA-256). The data
is written to a temporary file, synced and renamed, and the marker is written the same way after
it: a checkpoint counts only when its marker exists and matches, so a crash mid-write never
leaves one that will be loaded, and a damaged latest checkpoint falls back to the one before.
The last ``keep`` (at least 2) are kept; rank 0 deletes older ones.

What is saved: for each keyword, ``obj.state_dict()`` when it has one (models, optimizers, LR
schedulers, nbdist loaders), else the object itself (anything picklable); plus every rank's
random-number state (torch, numpy, random), restored to the rank it came from, so a resumed run
draws the same numbers an uninterrupted one would have.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import re
from pathlib import Path
from typing import Any

from ..errors import UsageError
from . import context, reporter
from .state import engine

_NAME = re.compile(r"^step-(\d{8})\.pt$")


def set_run(key: str) -> None:
    """Name the current run (the folder its checkpoints go to by default)."""
    engine.run_key = key


def _default_dir() -> Path:
    from ..config import data_dir

    return data_dir() / "checkpoints" / engine.run_key


def _rng_state() -> dict:
    import torch

    state = {"torch": torch.get_rng_state(), "random": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy

        state["numpy"] = numpy.random.get_state()
    except ImportError:
        pass
    return state


def _set_rng_state(state: dict) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["random"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])


def _unwrap(obj: Any) -> Any:
    return getattr(obj, "module", obj) if type(obj).__name__ == "DistributedDataParallel" else obj


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def writable_dir(path: str | os.PathLike | None = None) -> Path:
    """The checkpoint folder, created and checked for writing: a clear error before training."""
    folder = Path(path).expanduser() if path is not None else _default_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise UsageError(
            f"checkpoint folder {folder} is not writable ({e.strerror}): pass "
            "dir= a folder you can write, or set NBDIST_DATA_DIR"
        ) from None
    return folder


def _per_rank(state: dict) -> dict:
    """What differs between ranks: the global random state and any torch.Generator passed in."""
    import torch

    gens = {k: v.get_state() for k, v in state.items() if isinstance(v, torch.Generator)}
    return {"rng": _rng_state(), "generators": gens}


def _gather(mine: dict) -> list:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [mine]
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return everyone


def checkpoint(
    step: int, every: int = 1, *, dir: str | os.PathLike | None = None, keep: int = 3, **state
) -> bool:
    """Save ``state`` after ``step`` when ``step % every == 0``; return True when it saved.

    Call it on every rank, at the same steps (it gathers each rank's random state). Only rank 0
    writes. ``restore`` then continues from ``step + 1``.
    """
    import torch

    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise UsageError(f"nbdist.checkpoint: step must be a whole number >= 0, not {step!r}")
    if not isinstance(every, int) or every < 1:
        raise UsageError(f"nbdist.checkpoint: every must be a whole number >= 1, not {every!r}")
    if not state:
        raise UsageError("nbdist.checkpoint: name what to save, e.g. model=model, opt=opt")
    if step % every:
        return False
    import torch as _torch

    rngs = _gather(_per_rank(state))
    state = {k: v for k, v in state.items() if not isinstance(v, _torch.Generator)}
    if context.current().rank != 0:
        return True
    folder = writable_dir(dir)
    payload = {
        "step": step,
        "world_size": len(rngs),
        "rng": rngs,
        "state": {
            k: (_unwrap(v).state_dict() if hasattr(_unwrap(v), "state_dict") else v)
            for k, v in state.items()
        },
    }
    buf = io.BytesIO()
    torch.save(payload, buf)
    data = buf.getvalue()
    name = f"step-{step:08d}"
    _atomic_write(folder / f"{name}.pt", data)
    marker = {"step": step, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    _atomic_write(folder / f"{name}.json", json.dumps(marker).encode())
    reporter.event("checkpoint", f"checkpoint of step {step} written", step=step)
    for old in _complete(folder)[max(2, keep) :]:
        for suffix in (".json", ".pt"):
            (folder / f"step-{old:08d}{suffix}").unlink(missing_ok=True)
    return True


def _complete(folder: Path) -> list[int]:
    """Steps with a marker, newest first."""
    steps = []
    for f in folder.glob("step-*.pt"):
        m = _NAME.match(f.name)
        if m and f.with_suffix(".json").exists():
            steps.append(int(m.group(1)))
    return sorted(steps, reverse=True)


def _load_latest(folder: Path) -> tuple[dict | None, list[str]]:
    """The newest checkpoint that verifies, and what was skipped on the way (and why)."""
    import torch

    skipped = []
    if not folder.is_dir():
        return None, skipped
    for step in _complete(folder):
        path = folder / f"step-{step:08d}.pt"
        try:
            marker = json.loads(path.with_suffix(".json").read_text())
            data = path.read_bytes()
            if len(data) != marker["bytes"] or hashlib.sha256(data).hexdigest() != marker["sha256"]:
                raise ValueError("checksum mismatch")
            payload = torch.load(io.BytesIO(data), weights_only=False)
            if not all("generators" in r for r in payload["rng"]):
                raise ValueError("not a checkpoint of this nbdist version")
            return payload, skipped
        except Exception as e:
            skipped.append(f"{path.name}: {e}")
    return None, skipped


def restore(*, dir: str | os.PathLike | None = None, **state) -> int:
    """Load the latest good checkpoint into ``state``'s objects; return the step to continue from.

    0 on a fresh run (no checkpoint yet). Call it on every rank: rank 0 reads the file and
    broadcasts it. Objects with ``load_state_dict`` are loaded in place, dicts are refilled in
    place, and other values (numbers, lists) come back from ``nbdist.restored()``.
    """
    import torch.distributed as dist

    info = context.current()
    payload = None
    skipped: list[str] = []
    if info.rank == 0:  # the folder must take the checkpoints to come: say so before training
        payload, skipped = _load_latest(writable_dir(dir))
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        box = [payload]
        dist.broadcast_object_list(box, src=0)
        payload = box[0]
    for note in skipped:
        print(f"nbdist.restore: skipped damaged checkpoint {note}")
    if payload is None:
        engine.restored = {}
        return 0
    saved = payload["state"]
    import torch

    rngs = payload["rng"]
    mine = rngs[info.rank] if len(rngs) == info.world_size else None
    gens = {k: v for k, v in state.items() if isinstance(v, torch.Generator)}
    state = {k: v for k, v in state.items() if k not in gens}
    missing = sorted(set(state) - set(saved))
    missing += sorted(set(gens) - set(mine["generators"] if mine else ()))
    if missing:
        raise UsageError(
            f"nbdist.restore: the checkpoint has no {missing}; it holds {sorted(saved)}"
        )
    for k, obj in state.items():
        target = _unwrap(obj)
        if hasattr(target, "load_state_dict"):
            target.load_state_dict(saved[k])
        elif isinstance(target, dict):  # plain dicts are refilled in place
            target.clear()
            target.update(saved[k])
    engine.restored = {
        k: v for k, v in saved.items() if not hasattr(_unwrap(state.get(k)), "load_state_dict")
    }
    if mine is not None:  # same world size: every rank gets its own random state back
        _set_rng_state(mine["rng"])
        for k, g in gens.items():
            g.set_state(mine["generators"][k])
    if info.rank == 0:  # the dashboard and the run store show where the run picked up
        reporter.event(
            "resumed",
            f"resumed from the checkpoint of step {payload['step']}",
            step=payload["step"] + 1,
        )
    return payload["step"] + 1


def restored() -> dict:
    """Saved objects without ``load_state_dict`` (plain values), from the last ``restore``."""
    return dict(engine.restored)
