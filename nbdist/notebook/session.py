"""The kernel's cluster: its engines, where each rank runs, its process group, and its cells.

One ``Cluster`` at a time per kernel. It starts engines, places ranks, forms the process group,
runs ``%%distributed`` cells through the supervisor, and repairs itself after a failure: a dead
engine is replaced (same rank, fresh engine) and the group is re-formed before the next cell.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import io
import itertools
import time
import uuid
from collections.abc import Callable

from .. import config
from ..errors import DistributedCellError, NbdistError, UsageError
from ..worker import rendezvous, setup
from . import hosts, placement, recovery
from .cluster import EngineCluster, EngineExit
from .remote import RemoteEngines
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
        self.engines: EngineCluster | None = None
        self.slots: list[placement.Slot] = []
        self.backend = "gloo"
        self.master_addr = cfg.ip  # rank 0's host address as the other hosts reach it
        self.master_port = 0
        self.attempt = 0
        self.group_ready = False
        self.ready_seconds = 0.0
        self.inventory: dict[int, dict] = {}
        self._exits: list[EngineExit] = []
        # every cell that succeeded, with its ranks (None: all), replayed on fresh engines
        # ...and notebook-side calls to redo (scatters), as callables, in the same order
        self.journal: list[tuple[str, tuple[int, ...] | None, str] | Callable[[], object]] = []
        self._replaying = False

    # -- life -------------------------------------------------------------------------------
    def _start(self) -> None:
        t0 = time.perf_counter()
        remote = self.cfg.remote is not None
        self.engines = RemoteEngines(self.cfg) if remote else EngineCluster(self.cfg)
        client = self.engines.start()
        self.cfg = self.engines.cfg  # remote engines settle the controller's address and threads
        self.inventory = self._setup(client.ids)
        if remote:
            self.engines.check(self.inventory)  # one environment across hosts, or a refusal
        self.slots, self.backend = placement.place(
            self.inventory, self.cfg.backend, self.cfg.allow_mixed
        )
        self._form_group()
        self.ready_seconds = time.perf_counter() - t0

    @property
    def client(self):
        return self.engines.client

    def _setup(self, engine_ids: list[int]) -> dict[int, dict]:
        ars = {
            eid: self.client[eid].apply_async(setup.setup, self.cfg.threads) for eid in engine_ids
        }
        return {eid: ar.get(self.cfg.start_timeout) for eid, ar in ars.items()}

    def _form_group(self) -> None:
        """(Re-)form the process group on every rank, under a fresh store prefix."""
        self.attempt += 1
        rank0 = self.slots[0]
        self.master_addr = (  # remote: rank 0's host address as the others reach it
            self.engines.address_of(rank0.engine_id) if self.cfg.remote else self.cfg.ip
        )
        self.master_port = self.client[rank0.engine_id].apply_sync(
            rendezvous.serve_store, self.master_addr
        )
        infos = self.rank_infos()
        ars = [
            self.client[s.engine_id].apply_async(
                rendezvous.form, infos[s.rank], self.cfg.group_timeout
            )
            for s in self.slots
        ]
        try:
            for ar in ars:
                ar.get(self.cfg.start_timeout)
        except Exception as exc:
            raise NbdistError(f"the process group did not form: {exc}") from exc
        self.group_ready = True

    def rank_infos(self) -> dict[int, dict]:
        """Each rank's RankInfo (as a dict), for the current attempt."""
        return {
            s.rank: dict(
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
    def drain_exits(self) -> list[EngineExit]:
        """Engine deaths reported since the last call."""
        out = []
        q = self.engines.exits
        while not q.empty():
            out.append(q.get_nowait())
        return out

    def replace(self, ranks: list[int]) -> None:
        """Give these ranks fresh engines (same rank numbers) and re-form the group."""
        pids = [self.slots[r].pid for r in ranks]
        self.engines.signal(pids, sig=9)
        self.engines.engine_pids.difference_update(pids)
        known = set(self.client.ids) | {s.engine_id for s in self.slots}
        new_ids = self.engines.add_engines(len(ranks), known)
        inv = self._setup(new_ids)
        for r, eid in zip(ranks, new_ids, strict=True):
            self.slots = placement.substitute(self.slots, r, eid, inv[eid])
            self.inventory[eid] = inv[eid]
        self._form_group()

    def shrink(self, lost: list[int]) -> None:
        """Go on without the lost ranks: renumber the survivors 0..k-1 and re-form the group."""
        pids = [self.slots[r].pid for r in lost]
        self.engines.signal(pids, sig=9)
        self.engines.engine_pids.difference_update(pids)
        keep = {s.engine_id: self.inventory[s.engine_id] for s in self.slots if s.rank not in lost}
        self.slots, self.backend = placement.place(keep, self.backend)
        self._form_group()

    # -- cells ------------------------------------------------------------------------------
    def run(
        self,
        source: str,
        opts: config.CellOptions | None = None,
        transform=None,
        observers: list | None = None,
    ):
        """Run ``source`` on the ranks (all by default); return rank 0's last expression value.

        ``observers`` are called with the CellRun's ranks at every poll (about 50 times a
        second) while the cell runs: the dashboard's way in.
        """
        opts = opts or config.CellOptions()
        check_syntax(source, transform or (lambda s: s))
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
        filename = f"<distributed-cell-{next(_cell_numbers)}>"
        run_key = f"{self.engines.cluster_id}-{uuid.uuid4().hex[:8]}"
        state = recovery.RunState(
            restarts_left=opts.restarts, world_size=n, min_workers=opts.min_workers or n
        )
        life = recovery.Lifecycle(observers or ())
        life.to("running")
        while True:
            run, report = self._run_once(source, opts, filename, run_key, observers, full)
            failure = recovery.classify(report.interrupted, [f.kind for f in report.failures])
            lost = sorted(set(report.lost))
            before = dataclasses.replace(state, lost=len(lost), world_size=len(self.slots))
            decision, state = recovery.decide(before, failure)
            if decision in (recovery.Decision.RESTART, recovery.Decision.SHRINK):
                life.to("recovering")
            if decision is recovery.Decision.RESTART:
                try:
                    self._notify(observers, "failure", report)
                    self.replace(lost)
                except NbdistError as exc:
                    decision, state = recovery.decide(
                        dataclasses.replace(before, replaceable=False), failure
                    )
                    if decision is recovery.Decision.RAISE:
                        run.raise_for(report, f"nbdist: no replacement engine: {exc}")
            if decision is recovery.Decision.SHRINK:
                self.shrink(lost)
            if decision in (recovery.Decision.RESTART, recovery.Decision.SHRINK):
                self._replay()
                self._notify(observers, "restart", report, restarts=state.restarts_done)
                life.to("running")
                continue
            break
        life.to(
            "interrupted" if report.interrupted else "failed" if report.failures else "finished"
        )
        note = self._recover(report, full)
        if state.restarts_done and not report.failures:
            note = f"nbdist: recovered {state.restarts_done} time(s)"
        if full and not report.failures and not report.interrupted:
            self.group_ready = not report.group_broken  # the cell may have destroyed it
            self.journal.append((source, opts.ranks, run_key))
        elif not full and not report.failures:
            self.journal.append((source, opts.ranks, run_key))
        if report.failures and failure is recovery.Failure.WORKER_LOST and opts.restarts:
            note = (
                note + "\n" if note else ""
            ) + f"nbdist: gave up after {opts.restarts} restart(s)"
        run.raise_for(report, note)
        if note and state.restarts_done:
            print(note)
        return report.value

    def _run_once(self, source, opts, filename, run_key, observers, full):
        groups = {}
        if full and not self.group_ready:  # re-form the group inside this cell, on every rank
            self.attempt += 1
            groups = self.rank_infos()
        run = CellRun(self, source, opts, filename, groups, run_key)
        run.observers.extend(observers or [])
        return run, run.wait()

    def record(self, redo: Callable[[], object]) -> None:
        """Remember a notebook-side step (a scatter) that recovery must redo on fresh engines."""
        if not self._replaying:
            self.journal.append(redo)

    def _notify(self, observers, kind: str, report: CellReport, **data) -> None:
        """Tell observers that know about events (the dashboard) what recovery is doing."""
        for obs in observers or []:
            event = getattr(obs, "event", None)
            if event is None:
                continue
            if kind == "failure":
                for f in report.failures:
                    if not f.bystander:
                        event("failure", rank=f.rank, message=f.summary, cause=f.kind)
            else:
                event(kind, message=f"restart {data.get('restarts')}: resuming", **data)

    def _replay(self) -> None:
        """Run the journal of earlier cells again, on every rank, so fresh engines have their
        names: the cell being recovered then resumes from its checkpoint via nbdist.restore()."""
        self._replaying = True
        try:
            self._replay_all()
        finally:
            self._replaying = False

    def _replay_all(self) -> None:
        for i, entry in enumerate(self.journal):
            if callable(entry):  # a scatter: re-sent, re-sharded for the current world size
                with contextlib.redirect_stdout(io.StringIO()):
                    entry()
                continue
            source, ranks, run_key = entry
            opts = config.CellOptions(ranks=ranks, quiet=True)
            # with its own run key, a training cell resumes from its own last checkpoint
            _, report = self._run_once(source, opts, f"<replay-{i}>", run_key, None, ranks is None)
            if report.failures or report.interrupted:
                err = DistributedCellError(report.failures or [], "") if report.failures else None
                raise NbdistError(
                    f"recovery failed while replaying earlier cell #{i + 1}: {err or 'interrupted'}"
                )
            if ranks is None:
                self.group_ready = not report.group_broken

    def _recover(self, report: CellReport, full: bool) -> str:
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
        if not name.isidentifier():
            raise UsageError(f"{name!r} is not a variable name")
        if not 0 <= rank < len(self.slots):
            raise UsageError(f"rank must be between 0 and {len(self.slots) - 1}, not {rank}")
        packed = self.client[self.slots[rank].engine_id].apply_sync(_fetch, name)
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
        """One row per rank: rank, host, pid, device, its GPU (name, memory), state."""
        alive = set(self.client.ids) if self.client else set()
        return [
            {
                "rank": s.rank,
                "engine": s.engine_id,
                "host": s.host,
                "pid": s.pid,
                "device": s.device,
                "gpu": placement.gpu_label(self.inventory.get(s.engine_id, {}), s.device),
                "state": "ready" if s.engine_id in alive else "lost",
            }
            for s in self.slots
        ]


def _fetch(name: str) -> dict | None:
    """On an engine: the packed value of ``name``, or None when it is not defined."""
    from nbdist.worker.runner import portable
    from nbdist.worker.setup import _namespace

    ns = _namespace()
    return portable(ns[name]) if name in ns else None


def start(n: int | None = None, **options) -> Cluster:
    """Start a cluster of ``n`` engines (default 2) with a ready process group; make it current.

    Engines on other hosts: ``hosts="user@gpu1:4,user@gpu2:4"``, ``cluster_file=...`` or
    ``launcher="slurm"`` (see ``nbdist.notebook.hosts`` for every option)."""
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
