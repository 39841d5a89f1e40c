"""Checkpoints: ``nbdist.checkpoint(step, every=K, **state)`` and ``nbdist.restore(**state)``.

The lower level beneath ``nbdist.steps`` (``steps``), which calls both for you. Their
convention: ``step`` is the index of the step just finished (0 for the first step), and
``restore`` returns the index of the first step not yet done, which is also the number of
steps completed: after ``checkpoint(9, ...)``, ``restore`` returns 10. Call ``checkpoint`` after
the step's work, with that step's index.

Where they live: rank 0 writes them, on rank 0's host, into a folder of this run's own under
``dir`` (default: the engine's ``$NBDIST_DATA_DIR/checkpoints``). The run is the cell's run,
kept across nbdist's automatic restarts and replays; name it (``run="exp1"``) to resume it
from another cell or another kernel with ``--resume`` (without it, a new run under a name
that has checkpoints starts afresh, and those move aside: ``owner.claim``). ``restore`` reads
on rank 0 only and broadcasts the state over the process group, so engines on other hosts need
no access to the files. Point ``dir`` at a shared file system (a folder of your own) if rank
0's host itself may be lost. How files are written, verified and loaded (without running
code): ``files``.

A model sharded over ranks (DTensor weights: tensor parallel, FSDP2) or a pipeline's stages
are saved sharded instead (``sharded``): every rank writes its own shards into the run's
folder, which every host must then see, and no rank gathers the model.

What is saved: for each keyword, ``obj.state_dict()`` when it has one (models, optimizers, LR
schedulers), else the object itself, which must be tensors and plain values (dicts, lists,
numbers, strings): anything else is refused when saved, in one line naming the fix. Plus every
rank's random-number state (torch, numpy, random, and any ``torch.Generator`` passed in),
restored to the rank it came from, so a resumed run draws the numbers an uninterrupted run would
have drawn. Models and optimizers whose state differs between ranks (``sync="local_sgd"`` or
``"diloco"``: ``sync.is_rank_local``) are saved from every rank too, and each rank restores its
own (rank 0's when the world size changed), so a resumed run continues exactly. Ranks trained
with ``sync="async"`` wait for no other, at a checkpoint neither: each writes its own checkpoints
(the global model among them) into a folder of its own beside the run's (``RUN.rankR``), which
its host must see, and restores its own.
"""

from __future__ import annotations

import io
import os
import random
from pathlib import Path
from typing import Any

from ...errors import UsageError
from .. import context
from ..reporting.calls import event
from ..state import engine
from . import contents, files, folders, owner, positions, sharded, statedicts

Folder = str | os.PathLike | None


def set_run(key: str, run_id: str = "", resume: bool = False) -> None:
    """Name the current run: ``key`` the folder its checkpoints go to (unless ``run=`` names
    one), ``run_id`` the run itself (default ``key``; the same across its restarts and
    replays), ``resume`` whether it may continue an earlier run's checkpoints."""
    engine.run_key = key
    engine.run_id = run_id or key
    engine.resume = resume


def _folder(dir: Folder, run: str | None) -> Path:
    """The run's folder, made and claimed for this run (once per folder): rank 0 only."""
    folder = folders.prepare(folders.run_folder(dir, engine.run_key if run is None else run))
    claim = (str(folder), engine.run_id)
    if claim not in engine.claimed:
        note = owner.claim(folder, engine.run_id, engine.resume)
        engine.claimed.add(claim)
        if note:
            print(note)
            event("fresh", note)  # every note says the run starts afresh
    return folder


def _alone(state: dict) -> bool:
    """Whether ``state`` trains with ``sync="async"``: then every rank checkpoints on its own."""
    from ..train import sync

    return any(sync.is_asynchronous(v) for v in state.values())


def _meet_async() -> None:
    from ..train import asynchronous

    asynchronous.meet()


def _named(run: str | None, alone: bool) -> str | None:
    """The run's folder name; each async rank has one of its own beside it (``NAME.rankR``)."""
    if not alone:
        return run
    return f"{engine.run_key if run is None else run}.rank{context.current().rank}"


def _rng_state() -> dict:
    """This process's random states, as tensors and plain values (a weights-only load takes)."""
    import torch

    state: dict[str, Any] = {"torch": torch.get_rng_state(), "random": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy

        alg, keys, pos, has_gauss, gauss = numpy.random.get_state()
        state["numpy"] = (str(alg), keys.tolist(), int(pos), int(has_gauss), float(gauss))
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


def _saved_form(state: dict) -> dict:
    """What each keyword is saved as (its state_dict, or itself), checked to load safely."""
    out = {}
    for k, v in state.items():
        target = _unwrap(v)
        out[k] = target.state_dict() if hasattr(target, "state_dict") else v
        contents.check_safe(k, out[k])
    return out


def _split(state: dict) -> tuple[dict, dict]:
    """``state`` as (generators, everything else): generators are saved per rank."""
    import torch

    gens = {k: v for k, v in state.items() if isinstance(v, torch.Generator)}
    return gens, {k: v for k, v in state.items() if k not in gens}


def _gather(mine: dict) -> list:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [mine]
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return everyone


def _own_states(state: dict) -> list | None:
    """Each rank's own saved form of the objects in ``state`` that differ between ranks, on
    rank 0 (None elsewhere, and when there are none); tensors travel on the CPU."""
    import torch.distributed as dist

    from ..train import sync

    local = {k: v for k, v in state.items() if sync.is_rank_local(v)}
    if not local:  # the same answer on every rank: they prepared the same way
        return None
    mine = _on_cpu(_saved_form(local))
    if dist.get_world_size() == 1:
        return [mine]
    everyone: list | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, everyone, dst=0)
    return everyone


def _on_cpu(value: Any) -> Any:
    """``value`` with its tensors (also inside dicts, lists and tuples) copied to the CPU."""
    if hasattr(value, "detach"):
        return value.detach().cpu()
    if isinstance(value, dict):
        return type(value)((k, _on_cpu(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(_on_cpu(v) for v in value)
    return value


def _check_args(where: str, keep: int, state: dict) -> None:
    if not state:
        raise UsageError(f"nbdist.{where}: name what to save, e.g. model=model, opt=opt")
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        raise UsageError(f"nbdist.{where}: keep must be a whole number >= 1, not {keep!r}")


def save(
    step: int, *, dir: Folder, run: str | None, keep: int, state: dict, loader: Any = None
) -> None:
    """Save ``state`` (and ``loader``'s position) as the checkpoint of step ``step`` now (every
    rank calls it; rank 0 writes). ``checkpoint`` and ``steps`` decide when."""
    import torch

    gens, rest = _split(state)
    stage = engine.pipeline.stage if engine.pipeline is not None else None
    record = {
        "rng": _rng_state(),
        "generators": {k: g.get_state() for k, g in gens.items()},
        "stage": stage,
    }
    positions.put(record, loader)
    if statedicts.is_sharded(rest):  # every rank writes its own shards
        sharded.save(step, lambda: _folder(dir, run), keep, rest, record)
        return
    alone = _alone(rest)
    if alone:  # async ranks wait for no other: each writes its own, into its own folder
        rngs, own = [record], None
    else:
        rngs, own = _gather(record), _own_states(rest)
        if context.current().rank != 0:
            return
    payload = {
        "format": files.FORMAT,
        "step": step,
        "world_size": len(rngs),
        "rng": rngs,
        "state": _saved_form(rest),
    }
    if own is not None:
        payload["ranks"] = own
    folder = _folder(dir, _named(run, alone))
    buf = io.BytesIO()
    torch.save(payload, buf)
    files.write(folder, step, buf.getvalue())
    written = f"checkpoint of step {step} written"
    event("checkpoint", written, step=step, folder=str(folder), run=engine.run_id)
    files.prune(folder, keep)


def checkpoint(
    step: int,
    every: int = 1,
    *,
    dir: Folder = None,
    run: str | None = None,
    keep: int = 3,
    loader: Any = None,
    **state,
) -> bool:
    """Save ``state`` as the checkpoint of ``step`` when ``step % every == 0``; True when saved.

    ``step`` is the index of the step just finished (the first is 0): call this after the
    step's work. ``restore`` then returns ``step + 1``, the step to continue from. Call it on
    every rank, at the same steps (it gathers each rank's random state); only rank 0 writes. The
    last ``keep`` checkpoints (at least 2) are kept. ``loader``, a loader ``nbdist.loader``
    made, has its position saved with them (every rank's, its workers' included), so
    ``restore(..., loader=...)`` continues its epoch with the next batch. ``nbdist.steps``
    does all this for a loop.
    """
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise UsageError(f"nbdist.checkpoint: step must be a whole number >= 0, not {step!r}")
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise UsageError(f"nbdist.checkpoint: every must be a whole number >= 1, not {every!r}")
    _check_args("checkpoint", keep, state)
    positions.check("checkpoint", loader)
    if step % every:
        return False
    save(step, dir=dir, run=run, keep=keep, state=state, loader=loader)
    return True


def restore(*, dir: Folder = None, run: str | None = None, loader: Any = None, **state) -> int:
    """Load the latest good checkpoint of this run into ``state``'s objects; return the index
    of the step to continue from (the checkpoint's ``step + 1``), or 0 on a fresh run.

    Call it on every rank: rank 0 reads the file and broadcasts it. Objects with
    ``load_state_dict`` are loaded in place, dicts are refilled in place, and other values
    (numbers, lists) come back from ``nbdist.restored()``. ``state`` is checked here as
    ``checkpoint`` will save it, so what a checkpoint cannot hold is refused before training.
    ``loader`` gets the position saved with it: an iterator made from it after this call
    starts with the batch an uninterrupted run would have had next (with another number of
    ranks: the rest of that epoch, split over these ranks).
    """
    import torch.distributed as dist

    info = context.current()
    positions.check("restore", loader)
    gens, rest = _split(state)
    is_sharded = statedicts.is_sharded(rest)
    if is_sharded:  # refuse now what the first checkpoint would refuse
        statedicts.check(rest)
    else:
        _saved_form(rest)
    payload = None
    skipped: list[str] = []
    alone = _alone(rest)
    if info.rank == 0 or alone:  # the folder must take the checkpoints to come: say so now
        payload, skipped = files.load_latest(_folder(dir, _named(run, alone)))
    if not alone and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        box = [payload]
        dist.broadcast_object_list(box, src=0)
        payload = box[0]
    for note in skipped:
        print(f"nbdist.restore: skipped checkpoint {note}")
    if payload is None:
        engine.restored = {}
        if alone:
            _meet_async()
        return 0
    if payload["format"] == "dcp":  # every rank reads its own part
        mine, engine.restored = sharded.load(payload, rest, gens)
        known: list = [None] * info.world_size
        known[info.rank] = mine
        positions.resume(loader, known, payload["step"])
        return _resumed(payload["step"], mine, gens, info.rank)
    if is_sharded:
        raise UsageError(
            f"nbdist.restore: the latest checkpoint of this run (step {payload['step']}) holds "
            "whole models, and these are sharded: restore it into the model as it was built "
            "then, or pass run= a new run"
        )
    saved = payload["state"]
    rngs = payload["rng"]
    mine = rngs[0] if alone else rngs[info.rank] if len(rngs) == info.world_size else None
    missing = sorted(set(rest) - set(saved))
    missing += sorted(set(gens) - set(mine["generators"] if mine else ()))
    if missing:
        raise UsageError(
            f"nbdist.restore: the checkpoint has no {missing}; it holds {sorted(saved)}"
        )
    own = _own_saved(payload.get("ranks"), info.rank, info.world_size)
    for k, obj in rest.items():
        target = _unwrap(obj)
        if hasattr(target, "load_state_dict"):
            target.load_state_dict(own.get(k, saved[k]))
        elif isinstance(target, dict):  # plain dicts are refilled in place
            target.clear()
            target.update(saved[k])
    engine.restored = {
        k: v for k, v in saved.items() if not hasattr(_unwrap(rest.get(k)), "load_state_dict")
    }
    if alone:
        known: list = [None] * info.world_size
        known[info.rank] = mine
        positions.resume(loader, known, payload["step"])
        _meet_async()
    else:
        positions.resume(loader, rngs, payload["step"])
    return _resumed(payload["step"], mine, gens, info.rank)


def _resumed(step: int, mine: dict | None, gens: dict, rank: int) -> int:
    """The random states put back (``mine``: this rank's, None when the world size changed),
    the resumption announced; the step to continue from."""
    if mine is not None:  # same world size: every rank gets its own random state back
        _set_rng_state(mine["rng"])
        for k, g in gens.items():
            g.set_state(mine["generators"][k])
    if rank == 0:  # the dashboard and the run store show where the run picked up
        event("resumed", f"resumed from the checkpoint of step {step}", step=step + 1)
    return step + 1


def _own_saved(own: list | None, rank: int, world_size: int) -> dict:
    """What this rank saved itself, of the objects that differ between ranks; with another
    world size, nothing (rank 0's, saved for everyone, is loaded)."""
    return own[rank] if own and len(own) == world_size else {}


def restored() -> dict:
    """Saved objects without ``load_state_dict`` (plain values), from the last ``restore``."""
    return dict(engine.restored)
