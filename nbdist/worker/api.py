"""The engines' whole interface to the kernel: the only functions the kernel ships to engines.

The kernel calls these by reference (``client[eid].apply_async(api.run_cell, request)``), so
this module imports nothing heavy at the top: the kernel imports it without loading torch.
Each function is small and hands its work to the engine-side module that owns it; arguments
and results are the typed records of ``nbdist.protocol`` (or plain numbers and numpy buffers).
"""

from __future__ import annotations

import gc
import os
import platform
import socket
import sys
from typing import Any

from ..protocol import (
    CellOutcome,
    CellRequest,
    DebugReply,
    EngineIdentity,
    GpuInfo,
    Inventory,
    PackedValue,
    PostMortem,
    RankInfo,
    RankStacks,
    ShardMeta,
    ValueInfo,
)
from . import state


# -- an engine's life ----------------------------------------------------------------------------
def setup(
    threads: int, pin_cores: bool = True, shared_memory: bool = True, cluster_id: str = ""
) -> Inventory:
    """First contact with a fresh engine: give it ``threads`` intra-op threads (pinned to its
    share of the host's cores at each group formation, with ``pin_cores``), load torch, make
    ``nbdist`` a name in its namespace, and describe it (host, pid, GPUs, versions).
    ``shared_memory``: DDP models on CPU all-reduce through shared memory where their ranks
    share a host (``collectives.group``)."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)
    import torch

    from .._version import __version__
    from . import console, host, rendezvous, script
    from .collectives import group
    from .debug import stacks

    torch.set_num_threads(threads)
    state.engine.pin_cores = pin_cores
    state.engine.cluster_id = cluster_id  # where this rank's state is kept for a replacement
    host.tune_heap()  # a step reuses the memory the last one freed, as no torchrun worker does
    script.not_interactive()  # frameworks must see a script's process, not a REPL
    script.end_on_term()  # a SIGTERM ends the engine at once, not after the cell
    console.install()  # console progress bars; what a rank prints reaches the notebook as printed
    stacks.install()  # every thread's stack on a signal, even in C code
    state.namespace()["nbdist"] = sys.modules["nbdist"]  # cells say nbdist.rank() unimported
    rendezvous.install_idempotent_init()
    state.engine.shared_memory = shared_memory
    group.install()
    # The engine's own 200,000 objects (IPython, ipyparallel, torch) live as long as it does:
    # frozen out of the cyclic collector, a full collection in a cell walks only the cell's own
    # objects (0.24 s before, on the development VM; a torchrun worker's 0.12 s).
    gc.freeze()
    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append(GpuInfo(name=p.name, memory=p.total_memory))
    return Inventory(
        host=os.environ.get("NBDIST_HOST") or socket.gethostname(),
        cuda_visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
        pid=os.getpid(),
        threads=threads,
        gpus=tuple(gpus),
        python=platform.python_version(),
        torch=torch.__version__.split("+")[0],
        nbdist=__version__,
        executable=sys.executable,
    )


def identity() -> EngineIdentity:
    """Who this engine is, and which rank it holds (for ``nbdist.attach``)."""
    from . import rendezvous

    return EngineIdentity(
        pid=os.getpid(),
        host=socket.gethostname(),
        info=state.engine.rank_info,
        formed=rendezvous.is_formed(),
    )


def process_id() -> tuple[int, str | None]:
    """This engine's pid and the host name the notebook gave it (remote engines)."""
    return os.getpid(), os.environ.get("NBDIST_HOST")


# -- the process group ---------------------------------------------------------------------------
def host_address(peer: str, interface: str | None = None) -> str:
    """This host's address as ``peer`` reaches it (MASTER_ADDR for rank 0's host)."""
    from . import rendezvous

    return rendezvous.host_address(peer, interface)


def serve_store(addr: str, own: bool = False) -> int:
    """Serve the rendezvous store on ``addr`` (rank 0's engine; ``own``: a sweep trial's
    store, for its group alone); its port."""
    from . import rendezvous

    return rendezvous.serve_store(addr, own)


def form(info: RankInfo, timeout: float) -> float:
    """Join the process group as ``info``; seconds taken."""
    from ..launch import title
    from . import host, rendezvous

    host.busy()  # an old group's end waits for its loop's ticks (host.idle between cells)
    try:
        return rendezvous.form(info, timeout)
    finally:
        host.idle()
        title.engine_rank(info.rank, state.engine.cluster_id)  # "nbdist engine 3 (cluster X)"


def leave_group() -> None:
    """Leave the process group now, between cells: peers still waiting in a collective this
    rank will never join fail at once (``rendezvous.abort``)."""
    from . import host, rendezvous

    host.busy()  # the group's end waits for its loop's ticks
    rendezvous.abort()


def bring_back(fresh: list[int]) -> list[str]:
    """Take over this rank's state as it was kept at the end of its last good cell: a rank of
    ``fresh`` its lost engine's, a survivor its own; the lines to show; a KeyError when none
    was kept here (``continuity.snapshot``)."""
    from .continuity import snapshot

    rank = state.engine.rank_info.rank
    return snapshot.bring_back(rank, survivor=rank not in fresh)


# -- cells and values ----------------------------------------------------------------------------
def run_cell(request: CellRequest) -> CellOutcome:
    """Run one ``%%distributed`` cell here (see ``runner``)."""
    from . import runner

    return runner.run_cell(request)


def post_mortem(rank: int) -> PostMortem | None:
    """The frames of this engine's failed cell (``nbdist.post_mortem``); None if none failed."""
    from .debug import postmortem

    return postmortem.frames(rank)


def stacks() -> RankStacks:
    """Every thread's stack on this engine now (``%nbdist stacks``, between cells)."""
    from .debug import stacks

    return stacks.current()


def debug(line: str | None) -> DebugReply:
    """One command of ``%nbdist debug``'s pdb session over the failed cell (None: open it)."""
    from .debug import postmortem

    return postmortem.debug(line)


def fetch(name: str) -> PackedValue | None:
    """The packed value of ``name`` for ``%nbdist pull``; None when it is not defined."""
    from .values import portable

    ns = state.namespace()
    return portable(ns[name]) if name in ns else None


def fetch_trial(trial_id: int, name: str) -> PackedValue | None:
    """The packed value ``name`` had when a sweep's trial ended here (``%nbdist pull --trial``)."""
    from . import trials

    return trials.fetch(trial_id, name)


def forget_trials(keep: tuple[int, ...] = ()) -> None:
    """Drop what earlier trials left on this engine, except the trials in ``keep``."""
    from . import trials

    trials.forget(keep)


# -- data (``nbdist.scatter`` and ``nbdist.gather``; see ``shards``) -------------------------------
def free_memory() -> tuple[str, int]:
    """(host, bytes of memory available) on this engine's machine."""
    import psutil

    return socket.gethostname(), psutil.virtual_memory().available


def receive(token: str, meta: ShardMeta, tags: list[str], is_tuple: bool, *arrays: Any) -> int:
    """Hold this rank's shard under ``token`` until the notebook commits it; its bytes."""
    from . import shards

    return shards.hold(token, meta, tags, is_tuple, arrays)


def commit(token: str, name: str) -> None:
    """Make the shard held under ``token`` visible as ``name``."""
    from . import shards

    shards.commit(token, name)


def discard(token: str) -> None:
    """Forget a shard that was never committed (the scatter failed on some rank)."""
    state.engine.pending_shards.pop(token, None)


def describe(name: str) -> ValueInfo | None:
    """What ``gather`` needs to know of ``name`` before asking for it; None when undefined."""
    from . import shards

    return shards.describe(name)


def export(name: str) -> tuple[list[str], list, bool]:
    """``name``'s value as raw buffers for the notebook (``gather``)."""
    from .. import wire

    return wire.pack(state.namespace()[name])
