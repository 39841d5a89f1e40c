"""Where each rank runs: ranks, local ranks, devices and the backend. Pure functions, no I/O.

Ranks are nbdist's, not ipyparallel's engine ids: engine ids change when an engine is replaced,
a rank never does. Ranks are numbered host by host (hosts in the order given, engines on a host by
engine id), so the ranks on one host are contiguous, as under torchrun.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

from ...errors import UsageError
from ...protocol import Inventory


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


def choose_backend(
    gpu_counts: list[int],
    local_ranks: list[int],
    allow_mixed: bool,
    gpu_index: list[int] | None = None,
) -> str:
    """``nccl`` when every rank has a GPU of its own, ``gloo`` when none has; a mix is refused
    unless ``allow_mixed`` (then gloo, on CPU everywhere, with a warning naming the ranks).

    A rank's GPU is ``gpu_index[rank]`` among the GPUs it sees (default: its local rank)."""
    index = local_ranks if gpu_index is None else gpu_index
    has_gpu = [i < n for n, i in zip(gpu_counts, index, strict=True)]
    if all(has_gpu) and has_gpu:
        return "nccl"
    if not any(has_gpu):
        return "gloo"
    short = sorted({i for i, g in enumerate(has_gpu) if not g})
    if allow_mixed:
        warnings.warn(
            f"nbdist: ranks {short} have no GPU of their own while the others do: training on "
            "CPU on every rank, with gloo (slower than NCCL on the GPUs)",
            UserWarning,
            stacklevel=3,
        )
        return "gloo"
    raise UsageError(
        f"ranks {short} have no GPU of their own while the others do: give every rank a GPU "
        "(fewer engines per host), or allow a CPU-only run with --allow-mixed (gloo, slower)"
    )


def _host_order(inventory: dict[int, Inventory]) -> list[str]:
    """Hosts in the order given (``host_index``, set for remote hosts), else as first seen."""
    hosts: list[str] = []
    for eid in sorted(inventory):
        if inventory[eid].host not in hosts:
            hosts.append(inventory[eid].host)
    first = {h: i for i, h in enumerate(hosts)}
    given: dict[str, int] = {}
    for inv in inventory.values():  # a replacement engine may not carry it: any engine will do
        if inv.host_index is not None:
            given[inv.host] = inv.host_index
    return sorted(hosts, key=lambda h: (given.get(h, len(hosts) + first[h]), first[h]))


def _gpu_indices(
    inventory: dict[int, Inventory], ordered: list[int], local_ranks: list[int]
) -> list[int]:
    """Each rank's GPU among those it sees: its local rank when the engines of its host share
    one view of the GPUs; 0 when each was given a ``CUDA_VISIBLE_DEVICES`` slice of its own
    (as schedulers do with one GPU per task)."""
    views: dict[str, list] = {}
    for e in ordered:
        views.setdefault(inventory[e].host, []).append(inventory[e].cuda_visible)
    own_slice = {
        h: len(v) > 1 and None not in v and "" not in v and len(set(v)) == len(v)
        for h, v in views.items()
    }
    return [
        0 if own_slice[inventory[e].host] else lr
        for e, lr in zip(ordered, local_ranks, strict=True)
    ]


def place(
    inventory: dict[int, Inventory], backend: str | None = None, allow_mixed: bool = False
) -> tuple[list[Slot], str]:
    """Assign ranks 0..N-1 to the engines in ``inventory`` (by engine id, as ``setup`` said).

    Returns the slots in rank order and the backend. A rank's device is ``cuda:LOCAL_RANK``
    (or ``cuda:0`` of its own ``CUDA_VISIBLE_DEVICES`` slice) when the backend is NCCL, or
    when it has a GPU and the run is not a CPU-only mix; ``cpu`` otherwise.
    """
    if not inventory:
        raise UsageError("no engines to place: start a cluster with %nbdist start -n 2")
    hosts = _host_order(inventory)
    ordered = sorted(inventory, key=lambda e: (hosts.index(inventory[e].host), e))
    per_host = {h: [e for e in ordered if inventory[e].host == h] for h in hosts}
    local_ranks = [per_host[inventory[e].host].index(e) for e in ordered]
    gpu_counts = [len(inventory[e].gpus) for e in ordered]
    gpu_index = _gpu_indices(inventory, ordered, local_ranks)
    has_gpu = [i < n for i, n in zip(gpu_index, gpu_counts, strict=True)]
    if backend is None:
        backend = choose_backend(gpu_counts, local_ranks, allow_mixed, gpu_index)
    elif backend == "nccl" and not all(has_gpu):
        short = [r for r, g in enumerate(has_gpu) if not g]
        raise UsageError(
            f"backend nccl needs a GPU for every rank, and ranks {short} have none: "
            "use --backend gloo, or fewer engines per host"
        )
    mixed = any(has_gpu) and not all(has_gpu)  # then CPU everywhere: one device type per group
    slots = []
    for rank, eid in enumerate(ordered):
        host = inventory[eid].host
        lr = local_ranks[rank]
        cuda = has_gpu[rank] and not mixed
        slots.append(
            Slot(
                rank=rank,
                engine_id=eid,
                host=host,
                pid=inventory[eid].pid,
                local_rank=lr,
                local_world_size=len(per_host[host]),
                group_rank=hosts.index(host),
                device=f"cuda:{gpu_index[rank]}" if cuda else "cpu",
            )
        )
    return slots, backend


def gpu_label(inv: Inventory | None, device: str) -> str:
    """The GPU behind ``device`` on the engine ``inv`` describes: ``"NVIDIA A100, 80.0 GiB"``;
    ``"-"`` on CPU; ``"?"`` when not known."""
    if not device.startswith("cuda"):
        return "-"
    index = int(device.partition(":")[2] or 0)
    gpus = inv.gpus if inv is not None else ()
    if index >= len(gpus):
        return "?"
    gpu = gpus[index]
    return f"{gpu.name}, {gpu.memory / 2**30:.1f} GiB"


def substitute(slots: list[Slot], rank: int, engine_id: int, inv: Inventory) -> list[Slot]:
    """The slots with ``rank`` moved to a replacement engine; every other rank stays put."""
    return [
        replace(s, engine_id=engine_id, host=inv.host, pid=inv.pid) if s.rank == rank else s
        for s in slots
    ]
