"""The kernel's one cluster, as the person holds it: start it, attach to one, run cells, pull.

``start()`` (``%nbdist start``) or ``attach()`` (``%nbdist attach``) makes a ``Cluster`` the
kernel's current one; ``current()`` finds it (data, sweeps and the magics ask for it here);
``Cluster.run`` runs a cell on its ranks through ``notebook.run`` (the controller, the
supervisor, recovery); ``pull`` brings an engine's variable into the notebook;
``run_script`` is ``%nbdist run`` from Python; ``post_mortem`` the frames a failed cell left.
"""

from __future__ import annotations

import atexit
import gc
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import config
from ..errors import UsageError
from ..protocol import PipelineRole, PostMortem, Program
from ..worker import api
from .cluster import attach as attaching
from .cluster import fanout, hosts, placement
from .cluster.ranks import Ranks
from .cluster.transfer import EngineValue, unpack
from .debug import postmortem
from .debug import profile as profiling
from .debug.profile import Profile
from .run import controller, programs
from .run.observers.watch import Watch

_current: Cluster | None = None
#: Seconds a pull may take (a large value pickled, sent and unpickled) before it is given up.
PULL_TIMEOUT = 600.0


class Cluster(Ranks):
    """A running cluster of engines, one rank each (``Ranks``), that runs cells: ``run``,
    ``pull``, ``status``. Use as a context manager to stop it on exit."""

    def stop(self) -> None:
        """Stop every engine and the controller; no process is left behind."""
        global _current
        super().stop()
        if _current is self:
            _current = None
            gc.unfreeze()  # the kernel's heap is the collector's again (see _adopt)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<nbdist.Cluster {len(self.slots)} ranks, backend {self.backend}>"

    # -- cells ------------------------------------------------------------------------------
    def run(
        self,
        source: str,
        opts: config.CellOptions | None = None,
        transform: Callable[[str], str] | None = None,
        watch: Watch | None = None,
    ):
        """Run ``source`` on the ranks (all by default); return rank 0's last expression value.

        Unwatched unless ``watch`` is given (``run.observers.assembly``: ``assemble`` for the
        run store and the dashboard, as ``%%distributed`` has them; ``bare`` for observers of
        your own): it is told what the ranks report and how the run goes, and closed at its end.
        """
        return self.run_program(programs.cell(source, transform), opts, watch)

    def run_program(
        self,
        program: Program,
        opts: config.CellOptions | None = None,
        watch: Watch | None = None,
    ):
        """Run a cell or script (``run.programs``) on the ranks; return a cell's last value."""
        return controller.run(self, program, opts or config.CellOptions(), watch)

    # -- data back --------------------------------------------------------------------------
    def pull(self, name: str, rank: int = 0):
        """Bring the engine variable ``name`` from ``rank`` into the notebook."""
        if not isinstance(name, str) or not name.isidentifier():
            raise UsageError(f"{name!r} is not a variable name: use letters, digits and _")
        rank = config.whole(rank, "rank", 0, len(self.slots) - 1)
        got = fanout.on_ranks(self, api.fetch, name, ranks=[rank], timeout=PULL_TIMEOUT)
        got.check(f"pull of {name!r}", UsageError)
        packed = got.values[rank]
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
        """One row per rank: rank, host, pid, device, its GPU (name, memory), state, its
        pipeline stage and replica when its latest cell built a pipeline, and its place in the
        mesh (``dp 1/2 tp 0/2``) while the group its ``nbdist.mesh`` was made over stands."""
        lost = fanout.lost(self) if self.client else {s.rank: "" for s in self.slots}
        return [
            {
                "rank": s.rank,
                "engine": s.engine_id,
                "host": s.host,
                "pid": s.pid,
                "device": s.device,
                "gpu": placement.gpu_label(self.inventory.get(s.engine_id), s.device),
                "state": "lost" if s.rank in lost else "ready",
                **_role_columns(self.roles.get(s.rank)),
                **({"mesh": str(self.meshes[s.rank])} if s.rank in self.meshes else {}),
            }
            for s in self.slots
        ]


def _role_columns(role: PipelineRole | None) -> dict:
    if role is None:
        return {}
    return {"stage": f"{role.stage}/{role.stages}", "replica": f"{role.replica}/{role.replicas}"}


def current(required: bool = True) -> Cluster | None:
    """The running cluster, or a one-line error that says how to start one."""
    if _current is None and required:
        raise UsageError("no nbdist cluster is running: start one with %nbdist start -n 2")
    return _current


def _adopt(cluster: Cluster) -> Cluster:
    """Make ``cluster`` the kernel's current one.

    While it runs, what the kernel holds by then (IPython, torch, ipyparallel, nbdist, the
    person's objects so far) is frozen out of the cyclic garbage collector's way: a full
    collection walked all of it once a cell (80 ms of the kernel's CPU in a 3 s cell, on a
    2-core machine), for nothing, since it lives as long as the kernel. Garbage is collected
    first; objects frozen are still freed when nothing refers to them, and ``stop`` unfreezes.
    """
    global _current
    if _current is not None:
        raise UsageError("a cluster is already running: stop it first with %nbdist stop")
    _current = cluster
    gc.collect()
    gc.freeze()
    return cluster


def start(n: int | None = None, **options) -> Cluster:
    """Start a cluster of ``n`` engines (default 2) with a ready process group; make it current.

    Engines on other hosts: ``hosts="user@gpu1:4,user@gpu2:4"``, ``cluster_file=...`` or
    ``launcher="slurm"`` (see ``nbdist.notebook.cluster.hosts`` for every option). More than 4
    engines per CPU, or more threads per engine than CPUs, only with ``oversubscribe=True``."""
    cfg = hosts.cluster_config(n, **options)  # bad options fail before anything else
    if _current is not None:
        raise UsageError("a cluster is already running: stop it first with %nbdist stop")
    cluster = Cluster(cfg)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return _adopt(cluster)


def attach(cluster_id: str | None = None) -> Cluster:
    """Connect this notebook to the running cluster ``cluster_id`` (default: the newest one
    started from the sidebar) and make it the current cluster (see ``cluster.attach``)."""
    if _current is not None:
        raise UsageError("a cluster is already in use here: %nbdist stop first, then attach")
    return _adopt(attaching.connect(cluster_id, Cluster))


def pull(name: str, rank: int = 0) -> Any:
    """Bring the engine variable ``name`` from ``rank`` (default 0) into the notebook."""
    return current().pull(name, rank=rank)


def post_mortem(rank: int | None = None) -> PostMortem:
    """The frames a failed ``%%distributed`` cell left on its rank, as data: file, line,
    function, source line and each local's repr (``%nbdist debug`` is pdb over the same).
    ``rank``: by default the rank that failed first by itself."""
    return postmortem.post_mortem(current(), rank)


def profile() -> Profile:
    """The last cell run with ``--profile``: ``.table`` (a row per rank: step, computing,
    communicating, waiting, waiting for data, in ms per step; ``.mostly``: computing, in
    collectives or waiting for data), ``.straggler`` (the rank the others wait for, or None)
    and ``.trace`` (the merged Chrome trace's path)."""
    return profiling.last()


def run_script(
    file: str | os.PathLike,
    *args: str,
    timeout: float | None = None,
    ranks: tuple[int, ...] | None = None,
    all_output: bool = False,
    restarts: int = 0,
    min_workers: int | None = None,
    progress_timeout: float = 300.0,
    dashboard: bool = True,
    total: int | None = None,
    tensorboard: str | None = None,
    stop_on_nan: bool = False,
    name: str = "",
    profile: int | bool = False,
    resume: bool = False,
    track: str | list[str] | None = None,
) -> None:
    """Run the script ``file`` on every rank with ``args`` as its command line, as
    ``torchrun --nproc-per-node N file args...`` would; ``%nbdist run`` from Python.

    The options are ``%%distributed``'s (``track="mlflow"`` is ``--track mlflow``). The
    script's global names stay on the engines when it ends (as after IPython's ``%run``), for
    later cells and ``%nbdist pull``; the process group stays formed (re-formed before the next
    cell if the script destroyed it).
    """
    program = programs.load(file, args)
    opts = config.CellOptions(
        timeout=timeout,
        ranks=tuple(ranks) if ranks is not None else None,
        all_output=all_output,
        restarts=restarts,
        min_workers=min_workers,
        progress_timeout=progress_timeout,
        profile=profile,
        resume=resume,
        name=name or Path(program.name).name,
        dashboard=dashboard,
        total=total,
        tensorboard=tensorboard,
        stop_on_nan=stop_on_nan,
        track=track or (),
    )
    programs.run_watched(current(), program, opts)


@atexit.register
def _stop_at_exit() -> None:
    if _current is not None:
        _current.stop()
