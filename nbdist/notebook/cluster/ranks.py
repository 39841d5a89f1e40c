"""The cluster's ranks: its engines, where each rank runs, and the process group over them.

``Ranks`` starts an engine set (local, remote or hosted: ``engines.base.EngineSet``), places one
rank on each engine, forms the process group, and mends itself when told to: a lost rank gets a
fresh engine (same rank number), or the survivors are renumbered, and the group is formed again.
It knows nothing of cells: ``notebook.run`` drives it (a cell, its failures, recovery), and
``notebook.session.Cluster``, the person's handle, is a ``Ranks`` that runs cells.
"""

from __future__ import annotations

import time
from typing import Any

from ...config import ClusterConfig
from ...errors import NbdistError, RankFailure
from ...protocol import Inventory, MeshCoords, PipelineRole, RankInfo
from ...worker import api
from . import fanout, placement
from .engines.base import EngineExit, EngineSet
from .journal import Journal


class Ranks:
    """A cluster of engines, one rank each, and its process group (see the module's text)."""

    def __init__(self, cfg: ClusterConfig):
        self.cfg = cfg
        self.engines: EngineSet | None = None
        self.slots: list[placement.Slot] = []
        self.backend = "gloo"
        self.master_addr = cfg.ip  # rank 0's host address as the other hosts reach it
        self.master_port = 0
        self.attempt = 0  # formations of the group so far: each uses its own rendezvous keys
        self.group_ready = False
        self.ready_seconds = 0.0
        self.inventory: dict[int, Inventory] = {}
        self.journal = Journal()  # what fresh engines are given again (notebook.run.replay)
        self.exited: dict[int, EngineExit] = {}  # engine deaths by pid (see drain_exits)
        self.roles: dict[int, PipelineRole] = {}  # each rank's stage, from its latest cell
        self.meshes: dict[int, MeshCoords] = {}  # each rank's place in its latest nbdist.mesh
        # how each rank failed in the latest cell, and the pid of the engine it failed on: a
        # post-mortem looks there (notebook.debug.postmortem)
        self.failed: dict[int, tuple[RankFailure, int]] = {}
        self.last_sweep: Any = None  # the latest sweep's table of trials (%nbdist pull --trial)

    # -- life -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engines, place the ranks and form the group (once, by ``nbdist.start``)."""
        t0 = time.perf_counter()
        self.engines = for_config(self.cfg)
        client = self.engines.start()
        self.cfg = self.engines.cfg  # remote engines settle the controller's address and threads
        self.inventory = self.engines.check(self._setup(client.ids))  # one environment, or no
        self.slots, self.backend = placement.place(
            self.inventory, self.cfg.backend, self.cfg.allow_mixed
        )
        self._form_group()
        self.ready_seconds = time.perf_counter() - t0

    @property
    def client(self):
        """ipyparallel's client of the engines."""
        return self.engines.client

    def stop(self) -> None:
        """Stop every engine and the controller; no process is left behind."""
        if self.engines is not None:
            self.engines.stop()

    # -- the process group ------------------------------------------------------------------
    def _setup(self, engine_ids: list[int]) -> dict[int, Inventory]:
        """Set fresh engines up (threads, torch, nbdist): their inventories by engine id."""
        got = fanout.call(
            self.client,
            {e: e for e in engine_ids},
            api.setup,
            self.cfg.threads,
            self.cfg.pin_cores,
            self.cfg.shared_memory,
            timeout=self.cfg.start_timeout,
        )
        got.check("setting up the engines", noun="engine")
        return got.values

    def _form_group(self) -> None:
        """(Re-)form the process group on every rank, under a fresh store prefix."""
        self.attempt += 1
        rank0 = self.slots[0]
        self.master_addr = self.engines.address_of(rank0.engine_id)
        self.master_port = self.client[rank0.engine_id].apply_sync(
            api.serve_store, self.master_addr
        )
        infos = self.rank_infos()
        calls = {s.rank: (s.engine_id, (infos[s.rank], self.cfg.group_timeout)) for s in self.slots}
        got = fanout.wait(fanout.submit_each(self.client, api.form, calls), self.cfg.start_timeout)
        if got.failures:
            raise NbdistError(
                f"the process group did not form: {fanout.describe_failures(got.failures)}"
            )
        self.group_ready = True

    def rank_infos(self) -> dict[int, RankInfo]:
        """Each rank's RankInfo, for the current formation of the group."""
        return {
            s.rank: RankInfo(
                rank=s.rank,
                world_size=len(self.slots),
                local_rank=s.local_rank,
                local_world_size=s.local_world_size,
                group_rank=s.group_rank,
                master_addr=self.master_addr,
                master_port=self.master_port,
                backend=self.backend,
                device=s.device,
                attempt=self.attempt,
            )
            for s in self.slots
        }

    def regroup(self) -> dict[int, RankInfo]:
        """The RankInfos of a group that the next cell forms on every rank, as it starts (a new
        formation: its own rendezvous keys)."""
        self.attempt += 1
        return self.rank_infos()

    # -- repair -----------------------------------------------------------------------------
    def drain_exits(self) -> dict[int, EngineExit]:
        """Every engine death known, by pid: one between cells, or outside a ``--ranks`` cell,
        is kept until a cell on that engine learns of it at once."""
        q = self.engines.exits
        while not q.empty():
            ex = q.get_nowait()
            self.exited[ex.pid] = ex
        return self.exited

    def replace(self, ranks: list[int]) -> None:
        """Give these ranks fresh engines (same rank numbers) and re-form the group."""
        self.engines.retire([self.slots[r].pid for r in ranks])
        known = set(self.client.ids) | {s.engine_id for s in self.slots}
        new_ids = self.engines.add_engines(len(ranks), known)
        inv = self._setup(new_ids)
        for r, eid in zip(ranks, new_ids, strict=True):
            self.slots = placement.substitute(self.slots, r, eid, inv[eid])
            self.inventory[eid] = inv[eid]
        for s in self.slots:  # alive now, whatever died under the same pid before
            self.exited.pop(s.pid, None)
        self._form_group()

    def shrink(self, lost: list[int]) -> None:
        """Go on without the lost ranks: renumber the survivors 0..k-1 and re-form the group."""
        self.engines.retire([self.slots[r].pid for r in lost])
        keep = {s.engine_id: self.inventory[s.engine_id] for s in self.slots if s.rank not in lost}
        self.slots, self.backend = placement.place(keep, self.backend)
        self._form_group()

    def repair(self, lost: list[int], group_broken: bool, full: bool) -> str:
        """Make the cluster whole again after a failed cell (``lost``: ranks whose engine died
        or was killed; ``full``: the cell ran on every rank); say what was done."""
        if lost:
            self.replace(sorted(set(lost)))
            return (
                f"nbdist: rank(s) {sorted(set(lost))} got fresh engines; names defined "
                "there by earlier cells are gone. The process group was re-formed."
            )
        if group_broken and full:
            self.group_ready = False  # re-formed at the start of the next cell, on every rank
            return "nbdist: the process group will be re-formed at the next cell."
        return ""


def for_config(cfg: ClusterConfig) -> EngineSet:
    """The engine set ``cfg`` asks for: remote hosts or schedulers, else local engines."""
    from .engines import forks

    if cfg.remote is not None:
        forks.discard()  # the spare of %load_ext would fork local engines: not wanted now
        from .engines.remote.engines import RemoteEngines

        return RemoteEngines(cfg)
    from .engines.local import LocalEngines

    return LocalEngines(cfg)
