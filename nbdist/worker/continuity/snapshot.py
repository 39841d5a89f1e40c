"""A rank's state kept for its replacement: what its names held when its last cell ended.

At the end of every cell that ran well here, the rank keeps its state, when it changed since the
last time (a fingerprint of its names: which objects they name, and the versions of the tensors
in them; one pass, no copy): the person's names (modules, optimizers, tensors, plain values,
functions and classes a cell defined), which of them are nbdist's prepared objects (and how they
train), the record of the groups its formation made, and its random states, in one pickle
(``cloudpickle``: shared objects stay shared, an optimizer keeps stepping its model's
parameters), written atomically, readable by its owner alone, in the data folder of its host
(``keep/<cluster>/rank-<r>.state``). When its engine dies, the fresh engine that takes the rank
over on the same host reads it back (``bring_back``): it holds what the lost one held at the end
of its last good cell, without any earlier cell run again, on any rank. A DDP model comes back
unbound, and the next cell binds it with the others (``rebinding``).

What cannot come back is said in one line, by name: a value that cannot be pickled (an open
file, a generator, a lock), or a state larger than ``LIMIT``. Scattered shards are not kept:
the notebook sends a fresh engine its shard again. Reading a file nobody but this user could
have written is the only unpickling here (``checkpoint.files``'s rule for what may be loaded).
"""

from __future__ import annotations

import io
import os
import pickle
import random
import re
import stat
import tempfile
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from ... import config, datadir
from ...errors import NbdistError
from .. import groups
from ..collectives import group as local
from ..state import engine, namespace

#: The largest state kept for a replacement; beyond it recovery runs earlier cells again.
LIMIT = 4 << 30
#: Names IPython keeps for itself (the history, the output cache, its own functions), and the
#: four ipyparallel puts in the namespace while it applies a call (``_<msg id>_f``, ``_args``,
#: ``_kwargs``, ``_result``: the running cell's own request among them; seen, every cell's
#: state differed from the last, and was pickled and written again for nothing).
_IPYTHON = re.compile(
    r"^(_+|_i+|_i?\d+|_[iod]h|In|Out|exit|quit|get_ipython|__\w+__"
    r"|_[0-9a-f]{8}_[0-9a-f_]+_(f|args|kwargs|result))$"
)


def folder() -> Path | None:
    """Where this cluster's ranks keep their states on this host (None before ``api.setup``)."""
    if not engine.cluster_id:
        return None
    base = datadir.private_dir(datadir.ensure(config.data_dir()) / "keep")
    return datadir.private_dir(base / engine.cluster_id)


def keep() -> list[str]:
    """Keep this rank's state for a replacement, if it changed since it was last kept; the
    lines to show (what could not be kept)."""
    try:
        where = folder()
    except (OSError, NbdistError) as e:  # the data folder: said, never a failed cell
        return [f"nbdist: rank {_rank()} cannot keep its state for a replacement ({e})"]
    if engine.rank_info is None or where is None:
        return []
    names = _names()
    mark = _fingerprint(names)
    if mark == engine.kept_mark:
        return []
    data = _dumps(names)
    engine.kept_mark = mark
    path = where / f"rank-{engine.rank_info.rank}.state"
    if len(data) > LIMIT:
        _remove(path)
        return _once(
            f"nbdist: rank {_rank()}'s state ({len(data) / 2**30:.1f} GiB) is more than nbdist "
            f"keeps for a replacement ({LIMIT / 2**30:.0f} GiB): if it is lost, earlier cells "
            "run again"
        )
    try:
        _write(path, data)
    except OSError as e:  # a full disk: the last state kept stays
        engine.kept_mark = None
        return _once(f"nbdist: rank {_rank()} cannot keep its state for a replacement ({e})")
    engine.kept_note = ""
    return []


def _once(line: str) -> list[str]:
    """``line``, unless it was the last one said (it is not said again at every cell)."""
    said, engine.kept_note = engine.kept_note, line
    return [] if line == said else [line]


def bring_back(rank: int, survivor: bool = False) -> list[str]:
    """Take over rank ``rank``'s state as it was kept at the end of its last good cell; the
    lines to show. A fresh engine (on the same host) takes its lost engine's; a ``survivor`` of
    a recovery goes back to its own, so that the cell's next attempt starts on every rank where
    the last good cell left it (names the attempt made are dropped; what could not be kept stays
    as it is). A KeyError when there is none to take."""
    where = folder()
    path = where / f"rank-{rank}.state" if where is not None else None
    data = _read(path) if path is not None else None
    if data is None:
        raise KeyError(f"rank {rank} kept no state on this host")
    kept = pickle.loads(data)  # noqa: S301 - this user's own file, checked by _read
    ns = namespace()
    left = kept["left"]
    if survivor:
        for name in set(_names()) - set(kept["names"]) - set(left):
            del ns[name]
    ns.update(kept["names"])
    for obj, plan in kept["plans"]:
        engine.training_plans[obj] = plan
    for obj, kind, where in kept["bound"]:
        groups.track(obj, kind, (-1, -1), where)  # bound at the next cell, with the others'
    if kept["log"] is not None:
        engine.previous_groups = kept["log"]
    _set_random(kept["random"])
    engine.kept_mark = _fingerprint(_names())
    if survivor or not left:
        return []
    return [f"nbdist: rank {rank} came back without {_listed(left)}"]


# -- what is kept ---------------------------------------------------------------------------------
def _names() -> dict[str, Any]:
    """The person's names worth keeping: not IPython's, not nbdist itself, not a scattered shard
    (sent again by the notebook)."""
    ns = namespace()
    return {
        k: v
        for k, v in list(ns.items())
        if not _IPYTHON.match(k) and k != "nbdist" and k not in engine.shards
    }


def _fingerprint(names: dict[str, Any]) -> tuple:
    """What changes when a name is bound to another object, or a tensor reached from one is
    changed in place (its version counter moves): cheap, and nothing is copied."""
    return tuple((k, id(v), _versions(v, 2)) for k, v in names.items())


def _versions(v: Any, depth: int) -> Any:
    if isinstance(v, torch.Tensor):
        return v._version
    if isinstance(v, torch.nn.Module):
        return sum(t._version for t in (*v.parameters(), *v.buffers()))
    if isinstance(v, torch.optim.Optimizer):
        return (
            len(v.state),
            sum(_versions(x, 0) or 0 for s in v.state.values() for x in s.values()),
        )
    if depth and isinstance(v, dict):
        return tuple((k, id(x), _versions(x, depth - 1)) for k, x in list(v.items())[:1000])
    if depth and isinstance(v, (list, tuple)):
        return tuple((id(x), _versions(x, depth - 1)) for x in list(v)[:1000])
    return None


def _dumps(names: dict[str, Any]) -> bytes:
    """The state as one pickle, with the names of what could not be pickled (left out: an open
    file, a generator, a lock...). What failed once is not tried again while its name holds it."""
    engine.unkept = {k: i for k, i in engine.unkept.items() if k in names}
    left = [k for k, v in names.items() if engine.unkept.get(k) == id(v)]
    names = {k: v for k, v in names.items() if k not in left}
    while True:
        state = {
            "names": names,
            "plans": [(o, p) for o, p in engine.training_plans.items() if _held(o, names)],
            "bound": [
                (b.ref(), b.kind, origin(b.ref())) for b in engine.bound if _held(b.ref(), names)
            ],
            "log": _log(),
            "random": _random(),
            "left": left,
        }
        try:
            return _pickle(state)
        except Exception:
            bad = [k for k, v in names.items() if not _picklable(v)]
            if not bad:  # no one name is to blame: none is kept, all named
                return _pickle(
                    {**state, "names": {}, "plans": [], "bound": [], "left": list(names)}
                )
            engine.unkept.update((k, id(names[k])) for k in bad)
            left += bad
            names = {k: v for k, v in names.items() if k not in bad}


def origin(obj: Any) -> str:
    """Which group an object was bound to, as the next formation finds its like: ``local``
    (the shared-memory group), or the group's name."""
    group = getattr(obj, "process_group", None)
    if isinstance(group, local.LocalGroup):
        return "local"
    try:
        return group.group_name if group is not None else ""
    except (RuntimeError, AttributeError):
        return ""


def _held(obj: Any, names: dict[str, Any]) -> bool:
    """Whether ``obj`` is one of the kept names' values (or the model inside one)."""
    return obj is not None and any(
        v is obj or getattr(v, "module", None) is obj for v in names.values()
    )


def _log() -> groups.Log | None:
    """The groups this formation made (their names and arguments, not the groups)."""
    log = engine.group_log
    if log is None:
        return None
    made = [groups.Made(m.name, m.kwargs, None) for m in log.made]  # the groups stay here
    return groups.Log(log.world_size, log.rank, made)


class _Pickler(cloudpickle.CloudPickler):
    """cloudpickle's pickler (a cell's functions and classes by value, modules by name), with
    a DDP model without its group, reducer and logger: torch's own pickling of one refuses any
    group but the default one."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, DistributedDataParallel):
            gone = ("process_group", "reducer", "logger")
            return _unbound_ddp, (
                type(obj),
                {k: v for k, v in obj.__dict__.items() if k not in gone},
            )
        return super().reducer_override(obj)


def _pickle(state: dict) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(state)
    return buf.getvalue()


def _unbound_ddp(cls: type, state: dict) -> DistributedDataParallel:
    """A DDP model back from a kept state, on this formation's default group for now (bound to
    its own at the next cell: ``rebinding``)."""
    ddp = cls.__new__(cls)
    ddp.__setstate__(state)
    return ddp


def _picklable(v: Any) -> bool:
    try:
        _pickle({"v": v})
        return True
    except Exception:
        return False


def _random() -> dict:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_random(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _rank() -> int:
    return engine.rank_info.rank if engine.rank_info is not None else -1


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return f"{'this name' if len(names) == 1 else 'these names'}: {shown}"


# -- the file -------------------------------------------------------------------------------------
def _write(path: Path, data: bytes) -> None:
    """``data`` in ``path``, whole or not at all (a temporary file renamed), owner-only."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        _remove(Path(tmp))
        raise


def _read(path: Path) -> bytes | None:
    """``path``'s bytes when it is a regular file of this user's, readable by no one else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            return None
        return f.read()


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
