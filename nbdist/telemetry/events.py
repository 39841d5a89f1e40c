"""The telemetry schema, one for all places: what engines send, the collector keeps, the store has.

Engine -> kernel. Every ``--refresh`` seconds while a cell runs, an engine publishes one ``Batch``
(its ``MetricRecord``s, ``EventRecord``s and maybe a ``HealthSample``) through ipyparallel's data
publication, under a fresh key ``nbdist:<pid>:<seq>`` in the result's ``metadata['data']``; the
collector pops the keys it has read, so a batch is never overwritten nor read twice, and ignores
batches of another ``VERSION``.

Kernel -> run store -> sidebar. The store keeps a row per run (``RUN_FIELDS``), a row per metric
record (``METRIC_COLUMNS``), each rank's latest ``WorkerHealth`` and every ``RunEvent``. Its
readers return dicts with exactly these names, and ``extension/src/api.ts`` declares the same
(``tests/unit/test_schema.py`` checks both). Nothing here imports torch or numpy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, NamedTuple

#: Version of the batch format; the collector ignores batches of another version.
VERSION = 1
#: Prefix of the data-publication keys nbdist owns.
KEY_PREFIX = "nbdist:"
#: What a rank publishes when the loss of another does not stop it (``sync="async"``): the
#: kernel lets such a cell end on the ranks still alive.
GOES_ON_KEY = "nbdist-goes-on"

#: A rank's state as the notebook classifies it: while its cell runs (``LIVE_STATES``), and once
#: it has ended (done; failed: its own code raised; stopped: by a peer's failure, an interrupt or
#: a timeout; dead: its engine is gone).
OK, SLOW, SILENT, DEAD = "ok", "slow", "silent", "dead"
DONE, FAILED, STOPPED = "done", "failed", "stopped"
LIVE_STATES = (OK, SLOW, SILENT)
STATES = (OK, SLOW, SILENT, DEAD, DONE, FAILED, STOPPED)

#: Run statuses in the store. ``lost``: the kernel writing it stopped without closing it.
RUN_STATUSES = ("running", "ok", "failed", "interrupted", "stopped", "lost")

#: Event kinds nbdist records: engine events (``checkpoint``, ``resumed``, ``fresh``: a run that
#: moved an earlier run's checkpoints aside, ``sync`` with the ranks' drift), verdicts on ranks,
#: recovery's (``failure``, ``restart``, ``replaced``: a rank's fresh engine at work), phase
#: changes, and the run's end (its status).
EVENT_KINDS = (
    "checkpoint",
    "resumed",
    "fresh",
    "sync",
    "nan",
    "slow",
    "silent",
    "died",
    "recovered",
    "failure",
    "restart",
    "replaced",
    "phase",
    "finished",
    "failed",
    "interrupted",
    "stopped",
)
#: The events that tell how a run failed and recovered (a rank died or raised, recovery's phase,
#: the restart, the fresh engine): a board keeps them in view, never pushed out by the latest
#: ordinary events (a run's many ``checkpoint`` and ``sync`` events).
RECOVERY_KINDS = frozenset({"died", "failed", "failure", "phase", "restart", "replaced"})


def key(pid: int, seq: int) -> str:
    """The data-publication key of one batch: unique per engine process and sequence number."""
    return f"{KEY_PREFIX}{pid}:{seq}"


# -- engine -> kernel (``nbdist.protocol`` re-exports these) ------------------------------------
class MetricRecord(NamedTuple):
    """One ``report()`` call. A named tuple: small and quick to pickle. ``report()`` queues the
    plain tuple of these fields (cheapest on the training thread); the engine's sender thread
    makes the record."""

    time: float  # engine clock
    step: int | None
    loss: float | None  # a tensor until the reporter's thread reads it (off the training thread)
    samples: float | None  # samples this rank processed since its previous report
    total: int | None  # steps in the run, when the cell says
    extra: dict[str, float] | None  # any other numbers (lr=..., comm_time=...)


class EventRecord(NamedTuple):
    """Something that happened on a rank (``nbdist.worker.reporter.event``)."""

    time: float
    kind: str
    message: str
    data: dict | None


@dataclass(frozen=True)
class PipelineRole:
    """A rank's place in a pipeline (``nbdist.pipeline``): its stage and its replica."""

    stage: int
    stages: int
    replica: int = 0
    replicas: int = 1

    def __str__(self) -> str:
        where = f"{self.stage}/{self.stages}"
        return where if self.replicas == 1 else f"{where} r{self.replica}"


#: The dimensions a mesh may have (``nbdist.mesh``), outermost first.
MESH_DIMENSIONS = ("pp", "dp", "tp")


@dataclass(frozen=True)
class MeshCoords:
    """A rank's place in the device mesh of its latest ``nbdist.mesh``: for each dimension
    (``pp``, ``dp``, ``tp``, outermost first), its name, size and this rank's coordinate."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    coords: tuple[int, ...]

    def __str__(self) -> str:
        return " ".join(
            f"{n} {c}/{s}" for n, c, s in zip(self.names, self.coords, self.sizes, strict=True)
        )

    def of(self, name: str) -> str | None:
        """This rank's coordinate along ``name`` as "i/n", or None without that dimension."""
        if name not in self.names:
            return None
        i = self.names.index(name)
        return f"{self.coords[i]}/{self.sizes[i]}"


@dataclass(frozen=True)
class HealthSample:
    """A rank's health, sampled every half second by the engine's reporter thread."""

    time: float  # engine clock when sampled
    host: str
    pid: int
    cpu: float | None = None  # % of one core, since the previous sample
    rss: int | None = None  # bytes
    gpu_util: float | None = None  # %, None without CUDA (or without NVML)
    gpu_mem: int | None = None  # bytes allocated by torch on this rank's GPU, None without CUDA
    last_step: float | None = None  # engine time of the last report(), None before the first
    step_time: float | None = None  # seconds between the last two report() calls
    comm_share: float | None = None  # fraction of the step spent in collectives, None if unknown
    # fraction of its steps spent waiting for the next batch (worker.reporting.datawait), over
    # the steps since the previous sample; None when no nbdist loader was iterated in the cell
    data_share: float | None = None
    reports: int = 0  # report() calls so far in this cell
    pipeline: PipelineRole | None = None  # the rank's stage, when its latest pipeline stepped
    idle_share: float | None = None  # fraction of its last pipeline step the stage waited
    mesh: MeshCoords | None = None  # the rank's coordinates in its latest nbdist.mesh
    collectives: int = 0  # collectives entered in this cell (worker.collectives.counting)
    in_collective: str = ""  # the one it is in now ("" when none)


@dataclass(frozen=True)
class Batch:
    """What an engine publishes every ``--refresh`` seconds while a cell runs."""

    rank: int
    seq: int
    sent: float
    metrics: list[MetricRecord] = field(default_factory=list)
    health: HealthSample | None = None
    events: list[EventRecord] = field(default_factory=list)
    v: int = VERSION


# -- kernel -> run store -> sidebar --------------------------------------------------------------
class RunEvent(NamedTuple):
    """An event of a run, from an engine or from the kernel (``rank`` None: the whole run)."""

    time: float
    kind: str
    rank: int | None
    message: str
    data: dict | None


@dataclass(frozen=True)
class WorkerHealth:
    """A rank's latest health as the kernel judges it: the store's ``health`` row, the
    sidebar's worker. ``state`` is the verdict (``STATES``); the ages are the kernel's view."""

    rank: int
    time: float
    host: str = ""
    state: str = OK
    cpu: float | None = None
    rss: float | None = None
    gpu_util: float | None = None
    gpu_mem: float | None = None
    step_time: float | None = None  # the collector's smoothed seconds per step
    comm_share: float | None = None
    data_share: float | None = None  # of its steps, waiting for the next batch
    heartbeat_age: float | None = None  # seconds since the rank's latest batch
    last_report_age: float | None = None  # seconds since its latest metric record
    mesh: str | None = None  # its coordinates in its nbdist.mesh, as MeshCoords writes them

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> WorkerHealth:
        """A row given as a dict (scripts, tests); missing values are None."""
        return cls(**{k: row[k] for k in HEALTH_COLUMNS if row.get(k) is not None})


#: A metric row in the store: who sent it and its record (``total`` goes to the run instead).
METRIC_COLUMNS = ("time", "rank", *(f for f in MetricRecord._fields if f not in ("time", "total")))
#: A health row in the store, in order.
HEALTH_COLUMNS = tuple(f.name for f in dataclasses.fields(WorkerHealth))
#: An event row in the store, in order.
EVENT_COLUMNS = RunEvent._fields
#: A run as the store lists it (``RunStore.list_runs``); ``get_run`` adds ``RUN_DETAIL_FIELDS``.
RUN_FIELDS = (
    "id",
    "name",
    "label",
    "started",
    "ended",
    "updated",
    "status",
    "cluster_id",
    "world_size",
    "step",
    "total",
    "loss",
    "nonfinite",
    "samples_per_s",
    "options",
    "listed",
)
RUN_DETAIL_FIELDS = ("source", "failures", "kernel_pid")
#: What the store's readers add to each run from its columns: ``error``, the failing rank and its
#: error in one line ("rank 1: KeyError: 'b'"), or "" for a run that did not fail; ``summary``,
#: each metric's last, least and greatest mean over ranks (``{"loss": {"last": ..., "min": ...,
#: "max": ...}}``). ``listed``: whether the run is listed as a run (``telemetry.listing``).
RUN_DERIVED = ("error", "summary")
