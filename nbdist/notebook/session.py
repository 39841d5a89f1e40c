"""The kernel's cluster: its engines, where each rank runs, its process group, and its cells.

One ``Cluster`` at a time per kernel. It starts engines, places ranks, forms the process group,
runs ``%%distributed`` cells through the supervisor, and repairs itself after a failure: a dead
engine is replaced (same rank, fresh engine) and the group is re-formed before the next cell.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import itertools
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

from .. import config
from ..errors import DistributedCellError, NbdistError, UsageError
from ..protocol import Inventory, PipelineRole, Program, RankInfo
from ..worker import api
from . import engines, fanout, hosts, placement
from .controller import RunController
from .engines import EngineExit, EngineSet
from .observers import RunObserver
from .supervisor import CellReport, CellRun, check_syntax
from .transfer import EngineValue, unpack

_current: Cluster | None = None
_cell_numbers = itertools.count(1)


def current(required: bool = True) -> Cluster | None:
    """The running cluster, or a one-line error that says how to start one."""
    if _current is None and required:
        raise UsageError("no nbdist cluster is running: start one with %nbdist start -n 2")
    return _current


class Cluster:
    """A running cluster of engines, one rank each. Use as a context manager to stop it on exit."""

    def __init__(self, cfg: config.ClusterConfig):
        self.cfg = cfg
        self.engines: EngineSet | None = None
        self.slots: list[placement.Slot] = []
        self.backend = "gloo"
        self.master_addr = cfg.ip  # rank 0's host address as the other hosts reach it
        self.master_port = 0
        self.attempt = 0
        self.group_ready = False
        self.ready_seconds = 0.0
        self.inventory: dict[int, Inventory] = {}
        # every cell that succeeded, with its ranks (None: all), replayed on fresh engines
        # ...and notebook-side calls to redo (scatters), as callables, in the same order
        self.journal: list[tuple[Program, tuple[int, ...] | None, str] | Callable[[], object]] = []
        self._journal_keys: dict[str, int] = {}  # a keyed step (a scatter's name): its place
        self._replaying = False
        self.exited: dict[int, EngineExit] = {}  # engine deaths by pid (see drain_exits)
        self.roles: dict[int, PipelineRole] = {}  # each rank's stage, from its latest cell
        self.last_sweep: Any = None  # the latest sweep's TrialTable (%nbdist pull --trial)

    # -- life -------------------------------------------------------------------------------
    def _start(self) -> None:
        t0 = time.perf_counter()
        self.engines = engines.for_config(self.cfg)
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
        return self.engines.client

    def _setup(self, engine_ids: list[int]) -> dict[int, Inventory]:
        """Set fresh engines up (threads, torch, nbdist): their inventories by engine id."""
        got = fanout.call(
            self.client,
            {e: e for e in engine_ids},
            api.setup,
            self.cfg.threads,
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
        """Each rank's RankInfo, for the current attempt."""
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

    def stop(self) -> None:
        """Stop every engine and the controller; no process is left behind."""
        global _current
        if self.engines is not None:
            self.engines.stop()
        if _current is self:
            _current = None

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<nbdist.Cluster {len(self.slots)} ranks, backend {self.backend}>"

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

    # -- cells ------------------------------------------------------------------------------
    def run(
        self,
        source: str,
        opts: config.CellOptions | None = None,
        transform: Callable[[str], str] | None = None,
        observers: list[RunObserver] | None = None,
    ):
        """Run ``source`` on the ranks (all by default); return rank 0's last expression value.

        ``observers`` are told of the run's phases and recovery events, and see the ranks at
        every poll of the supervisor (``observers.RunObserver``): the dashboard's way in.
        """
        return self.run_program(cell(source, transform), opts, observers)

    def run_program(
        self,
        program: Program,
        opts: config.CellOptions | None = None,
        observers: list[RunObserver] | None = None,
    ):
        """Run a cell or script (``programs``) on the ranks; return a cell's last value."""
        opts = opts or config.CellOptions()
        n = len(self.slots)
        if opts.ranks is not None:
            bad = [r for r in opts.ranks if not 0 <= r < n]
            if bad or not opts.ranks:
                raise UsageError(
                    f"--ranks must name ranks between 0 and {n - 1}, not {list(opts.ranks)}"
                )
        full = opts.ranks is None or sorted(set(opts.ranks)) == list(range(n))
        if opts.restarts and not full:
            raise UsageError("--restarts needs every rank: drop --ranks")
        if opts.min_workers is not None and opts.min_workers > n:
            raise UsageError(
                f"--min-workers {opts.min_workers} but the cluster has {n} ranks: give at most {n}"
            )
        controller = RunController(
            self,
            program,
            opts,
            run_key=f"{self.engines.cluster_id}-{uuid.uuid4().hex[:8]}",
            full=full,
            observers=observers,
        )
        return controller.run()

    def run_once(
        self,
        program: Program,
        opts: config.CellOptions,
        run_key: str,
        full: bool,
        observers: list[RunObserver] | None = None,
    ) -> CellReport:
        """One attempt at a cell on its ranks, watched to its end by the supervisor."""
        groups = {}
        if full and not self.group_ready:  # re-form the group inside this cell, on every rank
            self.attempt += 1
            groups = self.rank_infos()
        return CellRun(self, program, opts, groups, run_key, observers).wait()

    def record(self, redo: Callable[[], str | None], key: str | None = None) -> None:
        """Remember a notebook-side step (a scatter) that recovery must redo on fresh engines.

        A step with the ``key`` of an earlier one (a scatter to the same name) takes its place
        in the journal, so repeated scatters do not pile up. ``redo`` returns None, or one line
        saying why it could not be redone (its data is gone from the notebook)."""
        if self._replaying:
            return
        if key is not None and key in self._journal_keys:
            self.journal[self._journal_keys[key]] = redo
            return
        if key is not None:
            self._journal_keys[key] = len(self.journal)
        self.journal.append(redo)

    def journal_cell(self, program: Program, ranks: tuple[int, ...] | None, run_key: str) -> None:
        """Remember a cell (or script) that succeeded, for replay on fresh engines."""
        self.journal.append((program, ranks, run_key))

    def replay(self) -> None:
        """Run the journal of earlier cells again, on every rank, so fresh engines have their
        names: the cell being recovered then resumes from its checkpoint via nbdist.restore()."""
        self._replaying = True
        try:
            self._replay_all()
        finally:
            self._replaying = False

    def _replay_all(self) -> None:
        notes = ""  # scatters that could not be redone: said at once, and with a failure
        for i, entry in enumerate(self.journal):
            if callable(entry):  # a scatter: re-sent, re-sharded for the current world size
                with contextlib.redirect_stdout(io.StringIO()):
                    note = entry()
                if isinstance(note, str):
                    print(note)
                    notes += f" ({note})"
                continue
            program, ranks, run_key = entry
            opts = config.CellOptions(ranks=ranks, quiet=True)
            # with its own run key, a training cell resumes from its own last checkpoint
            report = self.run_once(program, opts, run_key, ranks is None)
            if report.failures or report.interrupted:
                err = DistributedCellError(report.failures or [], "") if report.failures else None
                raise NbdistError(
                    f"recovery failed while replaying earlier cell #{i + 1}: "
                    f"{err or 'interrupted'}{notes}"
                )
            if ranks is None:
                self.group_ready = not report.group_broken

    def repair(self, report: CellReport, full: bool) -> str:
        """Make the cluster whole again after a failed cell; say what was done."""
        if report.lost:
            self.replace(sorted(set(report.lost)))
            return (
                f"nbdist: rank(s) {sorted(set(report.lost))} got fresh engines; names defined "
                "there by earlier cells are gone. The process group was re-formed."
            )
        if report.group_broken and full:
            self.group_ready = False  # re-formed at the start of the next cell, on every rank
            return "nbdist: the process group will be re-formed at the next cell."
        return ""

    # -- data back --------------------------------------------------------------------------
    def pull(self, name: str, rank: int = 0):
        """Bring the engine variable ``name`` from ``rank`` into the notebook."""
        if not isinstance(name, str) or not name.isidentifier():
            raise UsageError(f"{name!r} is not a variable name: use letters, digits and _")
        rank = config.whole(rank, "rank", 0, len(self.slots) - 1)
        packed = self.client[self.slots[rank].engine_id].apply_sync(api.fetch, name)
        if packed is None:
            raise UsageError(f"name {name!r} is not defined on rank {rank}")
        value = unpack(packed)
        if isinstance(value, EngineValue):
            raise UsageError(
                f"{name!r} on rank {rank} cannot be sent to the notebook ({value.text[:60]}): "
                "pull something picklable, such as its state_dict()"
            )
        return value

    def status(self) -> list[dict]:
        """One row per rank: rank, host, pid, device, its GPU (name, memory), state, and its
        pipeline stage and replica when its latest cell built a pipeline."""
        alive = set(self.client.ids) if self.client else set()
        return [
            {
                "rank": s.rank,
                "engine": s.engine_id,
                "host": s.host,
                "pid": s.pid,
                "device": s.device,
                "gpu": placement.gpu_label(self.inventory.get(s.engine_id), s.device),
                "state": "ready" if s.engine_id in alive else "lost",
                **_role_columns(self.roles.get(s.rank)),
            }
            for s in self.slots
        ]


def _role_columns(role: PipelineRole | None) -> dict:
    if role is None:
        return {}
    return {"stage": f"{role.stage}/{role.stages}", "replica": f"{role.replica}/{role.replicas}"}


def cell(source: str, transform: Callable[[str], str] | None = None) -> Program:
    """A ``%%distributed`` cell as the ranks run it (``transform``: IPython's, for magics in
    it); a syntax error is one UsageError line, before anything is sent."""
    check_syntax(source, transform or (lambda s: s))
    name = f"<distributed-cell-{next(_cell_numbers)}>"
    return Program(source=source, filename=name, argv=(name,), cwd=os.getcwd())


def pull(name: str, rank: int = 0) -> Any:
    """Bring the engine variable ``name`` from ``rank`` (default 0) into the notebook."""
    return current().pull(name, rank=rank)


def start(n: int | None = None, **options) -> Cluster:
    """Start a cluster of ``n`` engines (default 2) with a ready process group; make it current.

    Engines on other hosts: ``hosts="user@gpu1:4,user@gpu2:4"``, ``cluster_file=...`` or
    ``launcher="slurm"`` (see ``nbdist.notebook.hosts`` for every option). More than 4 engines
    per CPU, or more threads per engine than CPUs, only with ``oversubscribe=True``."""
    global _current
    cfg = hosts.cluster_config(n, **options)  # bad options fail before anything else
    if _current is not None:
        raise UsageError("a cluster is already running: stop it first with %nbdist stop")
    cluster = Cluster(cfg)
    try:
        cluster._start()
    except BaseException:
        cluster.stop()
        raise
    _current = cluster
    return cluster


def adopt(cluster: Cluster) -> Cluster:
    """Make ``cluster`` (one built around running engines, by ``attach``) the current cluster."""
    global _current
    if _current is not None:
        raise UsageError("a cluster is already running: stop it first with %nbdist stop")
    _current = cluster
    return cluster


@atexit.register
def _stop_at_exit() -> None:
    if _current is not None:
        _current.stop()
