"""``nbdist.attach()``: use, from this notebook, a cluster that a cluster host holds.

A cluster started from the sidebar lives in its own process (``nbdist.host``): its
engines already have their ranks and their process group. Attaching connects this kernel to
that cluster (``engines.hosted.HostedEngines``), asks each engine which rank it holds, and
builds an ordinary cluster (a ``ranks.Ranks``) around it, so ``%%distributed`` cells, failure
handling and engine replacement work as on a cluster this kernel started. The host keeps ownership:
``%nbdist stop`` here only disconnects; the sidebar's stop button (or the host's end) stops
the engines.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ...config import ClusterConfig
from ...errors import NbdistError
from ...protocol import EngineIdentity, Inventory
from ...records import registry
from ...worker import api
from . import fanout, placement
from .engines import forks
from .engines.hosted import HostedEngines
from .engines.processes import Pids

if TYPE_CHECKING:
    import ipyparallel as ipp

    from .ranks import Ranks

R = TypeVar("R", bound="Ranks")


def _slots_from_engines(
    client: ipp.Client, n: int, timeout: float
) -> tuple[list[placement.Slot], int, bool]:
    """The ranks as the engines themselves hold them (an earlier notebook may have replaced
    some): slots, the latest attempt, and whether the group stands on every rank."""
    answers = fanout.call(client, {eid: eid for eid in client.ids}, api.identity, timeout=timeout)
    held: dict[int, list[tuple[int, EngineIdentity]]] = {}
    for eid, who in answers.values.items():  # an engine that died a moment ago does not answer
        if who.info is not None and who.info.world_size == n:
            held.setdefault(who.info.rank, []).append((eid, who))
    if sorted(held) != list(range(n)) or any(len(v) != 1 for v in held.values()):
        raise NbdistError(
            f"the engines do not hold ranks 0..{n - 1} one each (they hold {sorted(held)}): "
            "stop this cluster from the sidebar and start a new one"
        )
    slots, attempts, formed = [], set(), True
    for rank in range(n):
        eid, who = held[rank][0]
        info = who.info
        slots.append(
            placement.Slot(
                rank=rank,
                engine_id=eid,
                host=who.host,
                pid=who.pid,
                local_rank=info.local_rank,
                local_world_size=info.local_world_size,
                group_rank=info.group_rank,
                device=info.device,
            )
        )
        attempts.add(info.attempt)
        formed = formed and who.formed
    return slots, max(attempts), formed and len(attempts) == 1


def connect(cluster_id: str | None, make: Callable[[ClusterConfig], R]) -> R:
    """Connect to the running cluster ``cluster_id`` (default: the newest one started from the
    sidebar): ``make(cfg)`` (a ``Ranks`` or a subclass) with the ranks its engines hold."""
    t0 = time.perf_counter()
    rec = registry.find(cluster_id)
    forks.discard()  # the spare of %load_ext: this kernel starts no engines of its own now
    engines = HostedEngines(rec)
    cfg = engines.cfg
    cluster = make(cfg)
    try:
        client = engines.start()
    except (OSError, TimeoutError) as exc:
        raise NbdistError(f"cannot reach cluster {rec.cluster_id}: {exc}") from exc
    try:
        slots, attempt, formed = _slots_from_engines(client, cfg.n, cfg.start_timeout)
    except BaseException:
        engines.stop()
        raise
    engines.engine_pids = Pids(s.pid for s in slots)
    inventory = {
        s.engine_id: rec.inventory.get(s.engine_id)
        or Inventory(host=s.host, pid=s.pid, threads=rec.threads)
        for s in slots
    }
    # the next formation takes attempt + 1: rendezvous keys never reused; an earlier notebook
    # may have left the group broken (formed False): then it is re-formed at the next cell
    record = (rec.backend, rec.master_port, attempt, formed)
    cluster.adopt(engines, slots, inventory, record, time.perf_counter() - t0)
    return cluster
