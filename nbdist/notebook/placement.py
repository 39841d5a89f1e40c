"""Where each rank runs: ranks, local ranks, devices and the backend. Pure functions, no I/O.

Ranks are nbdist's, not ipyparallel's engine ids: engine ids change when an engine is replaced,
a rank never does. Ranks are numbered host by host (hosts in the order given, engines on a host by
engine id), so the ranks on one host are contiguous, as under torchrun.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import UsageError


@dataclass(frozen=True)
class Slot:
    """One rank's place: which engine, on which host, with which device."""

    rank: int
    engine_id: int
    host: str
    pid: int
    local_rank: int
    local_world_size: int
    group_rank: int
    device: str


def choose_backend(gpu_counts: list[int], local_ranks: list[int], allow_mixed: bool) -> str:
    """``nccl`` when every rank has a GPU of its own, ``gloo`` when none has; a mix is refused
    unless ``allow_mixed`` (then gloo, on CPU everywhere)."""
    has_gpu = [lr < n for n, lr in zip(gpu_counts, local_ranks, strict=True)]
    if all(has_gpu) and has_gpu:
        return "nccl"
    if not any(has_gpu) or allow_mixed:
        return "gloo"
    short = sorted({i for i, g in enumerate(has_gpu) if not g})
    raise UsageError(
        f"ranks {short} have no GPU of their own while the others do: give every rank a GPU "
        "(fewer engines per host), or allow a CPU-only run with allow_mixed=True (gloo, slower)"
    )


def place(
    inventory: dict[int, dict], backend: str | None = None, allow_mixed: bool = False
) -> tuple[list[Slot], str]:
    """Assign ranks 0..N-1 to the engines in ``inventory`` ({engine_id: setup() result}).

    Returns the slots in rank order and the backend.
    """
    if not inventory:
        raise UsageError("no engines to place: start a cluster with %nbdist start -n 2")
    hosts: list[str] = []
    for eid in sorted(inventory):
        if inventory[eid]["host"] not in hosts:
            hosts.append(inventory[eid]["host"])
    ordered = sorted(inventory, key=lambda e: (hosts.index(inventory[e]["host"]), e))
    per_host = {h: [e for e in ordered if inventory[e]["host"] == h] for h in hosts}
    local_ranks = [per_host[inventory[e]["host"]].index(e) for e in ordered]
    gpu_counts = [len(inventory[e].get("gpus", [])) for e in ordered]
    if backend is None:
        backend = choose_backend(gpu_counts, local_ranks, allow_mixed)
    slots = []
    for rank, eid in enumerate(ordered):
        host = inventory[eid]["host"]
        lr = local_ranks[rank]
        cuda = backend == "nccl" or (lr < gpu_counts[rank] and not allow_mixed)
        slots.append(
            Slot(
                rank=rank,
                engine_id=eid,
                host=host,
                pid=inventory[eid]["pid"],
                local_rank=lr,
                local_world_size=len(per_host[host]),
                group_rank=hosts.index(host),
                device=f"cuda:{lr}" if cuda else "cpu",
            )
        )
    return slots, backend


def substitute(slots: list[Slot], rank: int, engine_id: int, inv: dict) -> list[Slot]:
    """The slots with ``rank`` moved to a replacement engine; every other rank stays put."""
    return [
        replace(s, engine_id=engine_id, host=inv["host"], pid=inv["pid"]) if s.rank == rank else s
        for s in slots
    ]
