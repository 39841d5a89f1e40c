"""What a formation made: its groups beside the default one, in order, so the next formation makes
them again, and the objects bound to them.

Every group made on an engine while a formation stands (``dist.new_group``, however it is
reached: nbdist's shared-memory group for DDP, a device mesh's dimensions, a pipeline's, the
person's own) is recorded with the arguments it was made with (``Made``). torch names a group
by the count of groups made before it in its formation (or by a hash of its ranks), so a new
formation of the same world that makes the same groups in the same order gives each the name it
had: a device mesh, which finds its groups by name, finds the new ones, and an object that holds
a group (a DDP model, an FSDP module) can be handed the new group of the same name
(``continuity``). ``remake`` does that at the first cell after a stop. The objects that hold a
formation's groups are ``track``ed as they are made (``Bound``), in order, held weakly. Every
group's connections are ``tracked`` too: a failing rank shuts them all (``rendezvous.abort``),
so a peer blocked in any group's collective (a mesh's tensor-parallel one) fails at once.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch.distributed as dist

from .state import engine

T = TypeVar("T")

_c10d = dist.distributed_c10d
_original = _c10d._new_group_with_tag


@dataclass(frozen=True)
class Made:
    """One group a formation made: its name, the arguments it was made with, and the group
    (held weakly; None on a rank outside it)."""

    name: str
    kwargs: dict[str, Any]
    group: weakref.ref | None


@dataclass
class Log:
    """The groups one formation made, in order, and the world they were made in."""

    world_size: int = 0
    rank: int = -1
    made: list[Made] = field(default_factory=list)


def tcp() -> set:
    """This process's TCP connections: (descriptor, local end, remote end)."""
    import psutil

    return {
        (c.fd, tuple(c.laddr), tuple(c.raddr))
        for c in psutil.Process().net_connections(kind="tcp")
        if c.fd >= 0 and c.raddr
    }


def tracked(make: Callable[..., T], *args, **kwargs) -> T:
    """``make(*args, **kwargs)``, a group or the default group's formation: the connections it
    opens are the group's, shut with it on ``abort`` (``rendezvous``)."""
    ri = engine.rank_info
    if ri is None:  # no formation of nbdist's: nothing of its to shut
        return make(*args, **kwargs)
    before = tcp()
    made = make(*args, **kwargs)
    # the store's connections are not the group's: a store this engine serves (rank 0's, or a
    # sweep trial's) takes clients of other groups, which must never be shut with this one
    store_ep = (ri.master_addr, ri.master_port)
    engine.group_sockets.update(c for c in tcp() - before if store_ep not in (c[1], c[2]))
    return made


def _recorded(*args: Any, **kwargs: Any) -> Any:
    """``_new_group_with_tag``, which every ``new_group`` reaches: the group, its connections
    tracked (shut with the formation's on abort), recorded."""
    names = _original.__code__.co_varnames[: _original.__code__.co_argcount]
    kwargs = {**dict(zip(names, args, strict=False)), **kwargs}
    group = tracked(_original, **kwargs)
    log = engine.group_log
    if log is not None:
        member = group not in (None, dist.GroupMember.NON_GROUP_MEMBER)
        name = _c10d._world.pg_names.get(group, "") if member else ""
        ref = weakref.ref(group) if member else None
        log.made.append(Made(name, kwargs, ref))
    return group


@dataclass
class Bound:
    """An object bound to a formation's groups (``kind``: ``ddp``, ``fsdp``, ``mesh``, ...),
    held weakly, and the formation it is bound to (``formation``, as ``rendezvous`` counts)."""

    ref: weakref.ref
    kind: str
    formation: tuple[int, int]
    origin: str = ""  # its group when it was kept (``local``, or a name): a kept object's
    note: str = ""  # why it cannot be bound again, once that is known


def track(obj: Any, kind: str, formation: tuple[int, int], origin: str = "") -> None:
    """Remember ``obj``, made over the groups of ``formation``, to bind it to the next one
    (``origin``: the group it had, for one brought back from a kept state)."""
    engine.bound[:] = [b for b in engine.bound if b.ref() is not None]
    engine.bound.append(Bound(weakref.ref(obj), kind, formation, origin))


def install() -> None:
    """Record every group made on this engine from now on."""
    _c10d._new_group_with_tag = _recorded


def begin(world_size: int, rank: int) -> Log | None:
    """A formation begins: its own log from now on; the last formation's log, returned."""
    last, engine.group_log = engine.group_log, Log(world_size, rank)
    return last


def remake(log: Log) -> dict[str, dist.ProcessGroup]:
    """Make again, in order, the groups ``log``'s formation made (this formation must be of the
    same world: every rank makes them, in the same order, as groups must be made); the new
    groups by the names their old ones had (this rank's only)."""
    out: dict[str, dist.ProcessGroup] = {}
    for made in log.made:
        group = _recorded(**made.kwargs)
        if group not in (None, dist.GroupMember.NON_GROUP_MEMBER):  # this rank is in it
            out[made.name] = group
    return out


def same_world(log: Log | None) -> bool:
    """Whether ``log`` was made in a world like this formation's (its groups can be made
    again: the same size, this rank in the same place)."""
    if log is None or not dist.is_initialized():
        return False
    return (log.world_size, log.rank) == (dist.get_world_size(), dist.get_rank())
