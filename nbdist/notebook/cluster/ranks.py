"""The cluster's ranks: its engines, where each rank runs, and the process group over them.

``Ranks`` starts an engine set (local, remote or hosted: ``engines.base.EngineSet``), places one
rank on each engine, forms the process group, and mends itself when told to: a lost rank gets a
fresh engine (same rank number), or the survivors are renumbered, and the group is formed again.
It knows nothing of cells: ``notebook.run`` drives it (a cell, its failures, recovery), and
``notebook.session.Cluster``, the person's handle, is a ``Ranks`` that runs cells.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Callable

from ... import config
from ...config import ClusterConfig
from ...errors import NbdistError, RankFailure
from ...protocol import CellOutcome, Inventory, MeshCoords, PipelineRole, RankInfo
from ...worker import api
from . import fanout, placement, progress
from .engines.base import EngineExit, EngineSet
from .journal import Journal


class Ranks:
    """A cluster of engines, one rank each, and its process group (see the module's text).

    It owns its state: others read it (``slots``, ``group_ready``, ``failed``, ...) and ask it
    to change through its methods; nothing outside assigns its fields."""

    def __init__(self, cfg: ClusterConfig):
        self.cfg = cfg
        self.engines: EngineSet | None = None
        self.journal = Journal()  # what fresh engines are given again (notebook.run.replay)
        self._slots: list[placement.Slot] = []
        self._backend = "gloo"
        self._master_addr = cfg.ip  # rank 0's host address as the other hosts reach it
        self._master_port = 0
        self._attempt = 0  # formations of a group so far: each uses its own rendezvous keys
        self._group_ready = False
        self._ready_seconds = 0.0
        self._inventory: dict[int, Inventory] = {}
        self._exited: dict[int, EngineExit] = {}  # engine deaths by pid (see drain_exits)
        self._roles: dict[int, PipelineRole] = {}  # each rank's stage, from its latest cell
        self._meshes: dict[int, MeshCoords] = {}  # each rank's place in its latest nbdist.mesh
        self._failed: dict[int, tuple[RankFailure, int]] = {}
        self._line = progress.StartLine(shown=False)  # a start's (later formations: none)

    # -- what others read -------------------------------------------------------------------
    @property
    def slots(self) -> list[placement.Slot]:
        """Where each rank runs, by rank."""
        return self._slots

    @property
    def backend(self) -> str:
        return self._backend

    @property
    def master_addr(self) -> str:
        return self._master_addr

    @property
    def master_port(self) -> int:
        return self._master_port

    @property
    def attempt(self) -> int:
        """Formations of a group so far (each uses its own rendezvous keys)."""
        return self._attempt

    @property
    def group_ready(self) -> bool:
        """Whether the world's process group stands on every rank."""
        return self._group_ready

    @property
    def ready_seconds(self) -> float:
        return self._ready_seconds

    @property
    def inventory(self) -> dict[int, Inventory]:
        """What each engine has (threads, GPUs, versions), by engine id."""
        return self._inventory

    @property
    def roles(self) -> dict[int, PipelineRole]:
        """Each rank's pipeline stage, from its latest cell."""
        return self._roles

    @property
    def meshes(self) -> dict[int, MeshCoords]:
        """Each rank's place in its latest ``nbdist.mesh``."""
        return self._meshes

    @property
    def failed(self) -> dict[int, tuple[RankFailure, int]]:
        """How each rank failed in the latest cell, and the pid of the engine it failed on: a
        post-mortem looks there (``notebook.debug.postmortem``)."""
        return self._failed

    # -- life -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engines, place the ranks and form the group (once, by ``nbdist.start``)."""
        t0 = time.perf_counter()
        self._line = progress.StartLine()  # what the start waits for, live under the cell
        self.engines = for_config(self.cfg, self._line.say)
        client = self.engines.start()
        self.cfg = self.engines.cfg  # remote engines settle the controller's address and threads
        self._inventory = self.engines.check(self._setup(client.ids))  # one environment, or no
        self._slots, self._backend = placement.place(
            self._inventory, self.cfg.backend, self.cfg.allow_mixed
        )
        self._form_group()
        self._ready_seconds = time.perf_counter() - t0
        self._line.done(f"{len(self._slots)} engines up, their process group formed")

    def adopt(
        self,
        engines: EngineSet,
        slots: list[placement.Slot],
        inventory: dict[int, Inventory],
        record: tuple[str, int, int, bool],
        ready_seconds: float,
    ) -> None:
        """Take over engines a cluster host started (``cluster.attach``): their slots and
        inventories, and ``record``: the backend, rank 0's store port, the latest formation's
        attempt and whether the group stands on every rank."""
        self.engines = engines
        self._slots, self._inventory = slots, inventory
        self._backend, self._master_port, self._attempt, self._group_ready = record
        self._ready_seconds = ready_seconds

    @property
    def client(self):
        """ipyparallel's client of the engines."""
        return self.engines.client

    def stop(self) -> None:
        """Stop every engine and the controller; no process is left behind, nor the states
        its ranks kept on this host for replacements (``data_dir()/keep/<cluster>``)."""
        if self.engines is not None:
            self.engines.stop()
            if self.engines.owns_engines and self.engines.cluster_id:
                shutil.rmtree(config.data_dir() / "keep" / self.engines.cluster_id, True)

    # -- the process group ------------------------------------------------------------------
    def _setup(self, engine_ids: list[int]) -> dict[int, Inventory]:
        """Set fresh engines up (threads, torch, nbdist): their inventories by engine id."""
        pending = fanout.submit(
            self.client,
            {e: e for e in engine_ids},
            api.setup,
            self.cfg.threads,
            self.cfg.pin_cores,
            self.cfg.shared_memory,
            self.engines.cluster_id,
        )
        progress.wait_counted(pending, self.cfg.start_timeout, self._line, "engines set up")
        got = fanout.wait(pending, self.cfg.start_timeout, self.client)
        got.check("setting up the engines", noun="engine")
        return got.values

    def _form_group(self) -> None:
        """(Re-)form the world's process group on every rank now, on a fresh store."""
        infos = self.group_of(None, fresh_store=True)
        calls = {s.rank: (s.engine_id, (infos[s.rank], self.cfg.group_timeout)) for s in self.slots}
        pending = fanout.submit_each(self.client, api.form, calls)
        progress.wait_counted(pending, self.cfg.start_timeout, self._line, "ranks in the group")
        got = fanout.wait(pending, self.cfg.start_timeout)
        if got.failures:
            raise NbdistError(
                f"the process group did not form: {fanout.describe_failures(got.failures)}"
            )
        self._group_ready = True

    def group_of(
        self, ranks: tuple[int, ...] | None = None, fresh_store: bool = False
    ) -> dict[int, RankInfo]:
        """A new formation of a group: each member's ``RankInfo``, numbered from 0 in the order
        of ``ranks``. The one place groups are made: the world's (``ranks`` None: every rank, on
        the store rank 0's engine serves, a new one when ``fresh_store``) or a sweep trial's
        block (on a store of its own, served by the block's first engine). Each formation has
        its own rendezvous keys (``attempt``). The group forms when its members are told to:
        at once (``api.form``) or as a cell starts (``CellRequest.group``)."""
        self._attempt += 1
        if ranks is None:
            if fresh_store or not self._master_port:
                first = self.slots[0]
                self._master_addr = self.engines.address_of(first.engine_id)
                self._master_port = self.client[first.engine_id].apply_sync(
                    api.serve_store, self._master_addr
                )
            return self._infos(self.slots, self._master_addr, self._master_port)
        members = [self.slots[r] for r in ranks]
        addr = self.engines.address_of(members[0].engine_id)
        port = self.client[members[0].engine_id].apply_sync(api.serve_store, addr, True)
        infos = self._infos(members, addr, port)
        return {r: dataclasses.replace(infos[r], rank=i) for i, r in enumerate(ranks)}

    def _infos(self, slots: list[placement.Slot], addr: str, port: int) -> dict[int, RankInfo]:
        return {
            s.rank: RankInfo(
                rank=s.rank,
                world_size=len(slots),
                local_rank=s.local_rank,
                local_world_size=s.local_world_size,
                group_rank=s.group_rank,
                master_addr=addr,
                master_port=port,
                backend=self._backend,
                device=s.device,
                attempt=self._attempt,
            )
            for s in slots
        }

    def note_group(self, stands: bool) -> None:
        """Whether the world's group stands on every rank now: a cell that broke it, or a
        sweep whose trials formed groups of their own, leaves it to be re-formed by the next
        cell on every rank, as it starts."""
        self._group_ready = stands

    def note_cell(
        self, outcomes: dict[int, CellOutcome], failed: dict[int, tuple[RankFailure, int]]
    ) -> None:
        """What a cell left on its ranks: each answering rank's pipeline stage and mesh place,
        and the latest cell's failures (with the pid each failed on)."""
        for rank, out in outcomes.items():
            if out.kind in ("died", "hung"):  # no answer of its own
                continue
            self._roles.pop(rank, None)
            self._meshes.pop(rank, None)
            if out.pipeline is not None:
                self._roles[rank] = out.pipeline
            if out.mesh is not None:
                self._meshes[rank] = out.mesh
        self._failed = dict(failed)

    # -- repair -----------------------------------------------------------------------------
    def drain_exits(self) -> dict[int, EngineExit]:
        """Every engine death known, by pid: one between cells, or outside a ``--ranks`` cell,
        is kept until a cell on that engine learns of it at once."""
        q = self.engines.exits
        while not q.empty():
            ex = q.get_nowait()
            self._exited[ex.pid] = ex
        return self._exited

    def replace(self, ranks: list[int]) -> None:
        """Give these ranks fresh engines (same rank numbers) and re-form the group."""
        self.engines.retire([self.slots[r].pid for r in ranks])
        known = set(self.client.ids) | {s.engine_id for s in self.slots}
        new_ids = self.engines.add_engines(len(ranks), known)
        inv = self._setup(new_ids)
        for r, eid in zip(ranks, new_ids, strict=True):
            self._slots = placement.substitute(self._slots, r, eid, inv[eid])
            self._inventory[eid] = inv[eid]
        for s in self._slots:  # alive now, whatever died under the same pid before
            self._exited.pop(s.pid, None)
        self._form_group()

    def shrink(self, lost: list[int]) -> None:
        """Go on without the lost ranks: renumber the survivors 0..k-1 and re-form the group."""
        self.engines.retire([self.slots[r].pid for r in lost])
        keep = {s.engine_id: self._inventory[s.engine_id] for s in self.slots if s.rank not in lost}
        self._slots, self._backend = placement.place(keep, self._backend)
        self._form_group()

    def repair(self, lost: list[int], group_broken: bool, full: bool) -> str:
        """Make the cluster whole again after a failed cell (``lost``: ranks whose engine died
        or was killed; ``full``: the cell ran on every rank); say what was done."""
        if lost:
            self.replace(sorted(set(lost)))
            return (
                f"nbdist: rank(s) {sorted(set(lost))} got fresh engines. The process group was "
                "re-formed."
            )
        if group_broken and full:
            self._group_ready = False  # re-formed at the start of the next cell, on every rank
            return "nbdist: the process group will be re-formed at the next cell."
        return ""


def for_config(cfg: ClusterConfig, say: Callable[[str], None] | None = None) -> EngineSet:
    """The engine set ``cfg`` asks for: remote hosts or schedulers, else local engines (which
    ``say`` how their start goes: ``progress.StartLine``)."""
    from .engines import forks

    if cfg.remote is not None:
        forks.discard()  # the spare of %load_ext would fork local engines: not wanted now
        from .engines.remote.engines import RemoteEngines

        return RemoteEngines(cfg)
    from .engines.local import LocalEngines

    return LocalEngines(cfg, say)
