"""Sharded checkpoints: every rank writes its own shards with ``torch.distributed.checkpoint``
(DCP), and no rank gathers the model.

Used by ``save`` when the state holds a model whose weights are DTensors (tensor parallel, FSDP2,
both, tensor parallel replicated over dp) or a pipeline's stage (``statedicts.is_sharded``);
plain and DDP models keep the gathered format. Every rank must see the same folder: rank 0 makes
a temporary folder beside the checkpoints with a token in it, and every rank reads the token
before writing (``_agree``: one line naming the ranks that cannot, the same on every rank).
What each keyword becomes: ``statedicts``; the files, private, atomic and read safely:
``storage``.

A checkpoint written on one mesh loads onto another where DCP can reshard (e.g. dp=2 × tp=2 to
tp=4 or dp=4): each rank asks for the shards its own objects hold now. Each rank's random state
is saved under its rank and restored to it when the world size is the same.
"""

from __future__ import annotations

import secrets
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...errors import CheckpointWriteError, NbdistError, UsageError
from ..reporting.calls import event
from ..state import engine
from . import files, statedicts

_PROBE = "probe"  # the token file rank 0 leaves in the temporary folder for the others


def _world() -> tuple[int, int]:
    import torch.distributed as dist

    return dist.get_rank(), dist.get_world_size()


def _from_rank0(work: Callable[[], Any]) -> Any:
    """``work()``'s result on rank 0, sent to every rank; its error raised on every rank."""
    import torch.distributed as dist

    box: list = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = ("ok", work())
        except NbdistError as e:
            box[0] = ("error", e)
    dist.broadcast_object_list(box, src=0)
    kind, value = box[0]
    if kind == "error":
        raise value
    return value


def _agree(ok: bool, problem: str, **names: str) -> None:
    """Raise, on every rank, ``problem`` (formatted with ``names`` and the ranks and hosts
    where ``ok`` is False) unless it is True everywhere."""
    import torch.distributed as dist

    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (bool(ok), socket.gethostname()))
    bad = [(r, host) for r, (fine, host) in enumerate(everyone) if not fine]
    if bad:
        ranks = ", ".join(str(r) for r, _ in bad)
        hosts = ", ".join(sorted({h for _, h in bad}))
        raise UsageError(problem.format(ranks=ranks, hosts=hosts, **names))


_SHARED = (
    "ranks {ranks} (on {hosts}) cannot see rank 0's checkpoint folder {folder}, where every rank "
    "writes its shards of a sharded checkpoint: pass dir= a folder on a file system every host "
    "shares"
)


def _sees(tmp: Path, token: str) -> bool:
    try:
        return (tmp / _PROBE).read_text() == token
    except OSError:
        return False


def _begin(folder_of: Callable[[], Path], step: int) -> tuple[Path, Path, str]:
    """Rank 0: the run's folder, a fresh temporary folder in it, and the token left there."""
    from . import storage

    folder = folder_of()
    tmp = storage.temp_folder(folder, step)
    token = secrets.token_hex(16)
    files.write_atomic(tmp / _PROBE, token.encode())
    return folder, tmp, token


def _rng_part(record: dict, rank: int) -> dict:
    return {str(rank): (record,)}  # a tuple is one item: the record is saved and loaded whole


def _said(e: BaseException | str) -> str:
    """A failure in one line; of DCP's (every rank's failures), the first rank's storage error
    (an OSError), else its first."""
    failures = getattr(e, "failures", None)
    if failures:
        rank, (e, _) = min(failures.items(), key=lambda f: (not isinstance(f[1][0], OSError), f[0]))
        return f"rank {rank}: {_said(e)}"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    text = str(e).strip().splitlines()
    return (text[-1] if text else type(e).__name__)[:200]


def _write_error(step: int, folder: Path, cause: BaseException | str) -> CheckpointWriteError:
    return CheckpointWriteError(
        f"nbdist.checkpoint: could not write the shards of step {step} in {folder} "
        f"({_said(cause)}): free space there or pass dir= another folder; --restarts retries "
        "the cell"
    )


def save(step: int, folder_of: Callable[[], Path], keep: int, state: dict, record: dict) -> None:
    """Save ``state`` as the sharded checkpoint of ``step`` (every rank calls it, with its own
    random-state ``record``); ``folder_of()`` gives rank 0 the run's folder."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from . import storage

    rank, world = _world()
    kind_of = statedicts.kinds(state)
    stage = record.get("stage")
    mine = statedicts.saved(state, kind_of, stage, first=rank == 0)  # refused before any write
    folder, tmp, token = _from_rank0(lambda: _begin(folder_of, step))
    try:
        _agree(_sees(tmp, token), _SHARED, folder=str(folder))
    except UsageError:
        if rank == 0:
            files.remove(tmp)
        raise
    if rank == 0:  # every rank has read the token: it is no part of the checkpoint
        (tmp / _PROBE).unlink()
    writer = storage.Writer(tmp)
    try:
        dcp.save({**mine, "rng": _rng_part(record, rank)}, storage_writer=writer)
    except (Exception, CheckpointException) as e:  # every rank's failures, on every rank
        if rank == 0:
            files.remove(tmp)
        raise _write_error(step, folder, e) from None
    try:  # each rank hashes what it wrote; rank 0 lists them all in the marker
        listing: dict | str = {n: files.digest(tmp / n) for n in writer.written()}
    except OSError as e:
        listing = f"rank {rank}: {_said(e)}"
    everyone: list | None = [None] * world if rank == 0 else None
    dist.gather_object((listing, stage), everyone, dst=0)

    def finish() -> None:
        assert everyone is not None
        failed = [part for part, _ in everyone if isinstance(part, str)]
        if failed:
            files.remove(tmp)
            raise _write_error(step, folder, failed[0])
        header = {
            "world_size": world,
            "stages": [s for _, s in everyone],
            "state": kind_of,
            "generators": sorted(record["generators"]),
        }
        shards = {n: list(v) for part, _ in everyone for n, v in part.items()}
        storage.commit(folder, step, tmp, shards, header)

    _from_rank0(finish)  # every rank raises rank 0's failure to commit
    if rank == 0:
        written = f"checkpoint of step {step} written"
        event("checkpoint", written, step=step, folder=str(folder), run=engine.run_id)
        files.prune(folder, keep)


def load(found: dict, state: dict, gens: dict) -> tuple[dict | None, dict]:
    """Load the sharded checkpoint ``found`` (``files.load_latest``'s, from rank 0) into
    ``state`` on every rank: (this rank's random-state record, or None when the world size
    differs; the plain values restored)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from . import storage

    rank, world = _world()
    path = Path(found["path"])
    _agree((path / storage.METADATA).is_file(), _SHARED, folder=str(path.parent))
    kind_of, stages = found["state"], found["stages"]
    same = found["world_size"] == world
    missing = sorted(set(state) - set(kind_of))
    missing += sorted(set(gens) - set(found["generators"] if same else ()))
    if missing:
        raise UsageError(
            f"nbdist.restore: the checkpoint has no {missing}; it holds {sorted(kind_of)}"
        )
    stage = engine.pipeline.stage if engine.pipeline is not None else None
    target = statedicts.targets(state, kind_of, stages, stage)
    if same:
        target["rng"] = {str(rank): None}
    reader = storage.SafeReader(path)
    try:
        dcp.load(target, storage_reader=reader, planner=storage.SafePlanner())
    except (Exception, CheckpointException) as e:
        if reader.refused is not None:  # its metadata, not these objects
            raise reader.refused from None
        raise UsageError(
            f"nbdist.restore: the checkpoint {path} does not load into these objects "
            f"({_said(e)}): build them as the checkpointed run did"
        ) from None
    values = statedicts.put_back(state, kind_of, target, stage)
    return (target["rng"][str(rank)][0] if same else None), values
