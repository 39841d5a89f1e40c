"""What a cluster host says of the cluster it holds (the sidebar's "Start cluster"): its
``HostRecord``, with a ``SlotRecord`` per rank, written as JSON by the host (``nbdist.host``) and
read by the server and by ``nbdist.attach()`` (``records.registry`` keeps the files)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..protocol import Inventory, from_fields


@dataclass(frozen=True)
class SlotRecord:
    """Where one rank runs, as the host record keeps it."""

    rank: int
    engine_id: int
    host: str
    pid: int
    local_rank: int = 0
    local_world_size: int = 1
    group_rank: int = 0
    device: str = "cpu"


@dataclass(frozen=True)
class HostRecord:
    """A cluster host's record (``records.registry``): written by the host, read by the server
    to list clusters and by ``nbdist.attach()`` to connect. ``state``: starting, running,
    stopping, failed. Fields after ``started`` are known once the cluster is running."""

    pid: int
    n: int
    state: str = "starting"
    started: float = 0.0
    cluster_id: str | None = None
    error: str | None = None
    ready_seconds: float | None = None
    backend: str = "gloo"
    master_port: int = 0
    attempt: int = 0
    ip: str = "127.0.0.1"
    threads: int = 1
    profile_dir: str = ""
    log_dir: str = ""
    socket: str = ""
    slots: tuple[SlotRecord, ...] = ()
    engines: tuple[dict, ...] = ()  # {"pid": int, "rank": int | None}, every engine started
    inventory: dict[int, Inventory] = field(default_factory=dict)  # by engine id

    def to_dict(self) -> dict:
        out = asdict(self)
        out["slots"] = [asdict(s) for s in self.slots]
        out["engines"] = [dict(e) for e in self.engines]
        out["inventory"] = {str(k): v.to_dict() for k, v in self.inventory.items()}
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostRecord:
        """The record read from JSON; malformed, it raises what ``records.registry`` catches."""
        return from_fields(
            cls,
            {
                **data,
                "slots": tuple(from_fields(SlotRecord, s) for s in data.get("slots") or ()),
                "engines": tuple(dict(e) for e in data.get("engines") or ()),
                "inventory": {
                    int(k): Inventory.from_dict(v) for k, v in (data.get("inventory") or {}).items()
                },
            },
        )
