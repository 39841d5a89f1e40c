"""The records that cross a process boundary: kernel <-> engines, kernel <-> cluster host.

Both sides import this module, and it imports nothing heavy (no torch, no ipyparallel, no
numpy), so the kernel can describe engines without loading what they run. Every record is a
frozen dataclass; those that are written as JSON (the hosted-cluster record and the inventory
inside it) have ``to_dict``/``from_dict``. Telemetry records (``MetricRecord``,
``HealthSample``, ``EventRecord``, ``Batch``) are defined with the telemetry schema in
``nbdist.telemetry.events`` and re-exported here, so this is the one place to look.

Who sends what::

    kernel -> engine   setup(threads)               -> Inventory
    kernel -> engine   form(RankInfo, timeout)      -> None (the process group stands)
    kernel -> engine   run_cell(CellRequest)        -> CellOutcome
    kernel -> engine   receive(token, ShardMeta, …) -> bytes held
    kernel -> engine   describe(name)               -> ValueInfo | None
    engine -> kernel   Batch (MetricRecord, HealthSample, EventRecord) by data publication
    host   -> kernel   HostRecord (JSON file in the registry: ``records.host``)
"""

from __future__ import annotations

import dataclasses
import signal
from dataclasses import asdict, dataclass
from typing import Any

from .config import CellOptions
from .telemetry.events import (
    MESH_DIMENSIONS,
    Batch,
    EventRecord,
    HealthSample,
    MeshCoords,
    MetricRecord,
    PipelineRole,
)

__all__ = [
    "Batch",
    "CellOutcome",
    "CellRequest",
    "EngineIdentity",
    "EventRecord",
    "GpuInfo",
    "HealthSample",
    "Inventory",
    "MetricRecord",
    "PackedValue",
    "PipelineRole",
    "MeshCoords",
    "MESH_DIMENSIONS",
    "RankInfo",
    "ShardMeta",
    "TrialInfo",
    "ValueInfo",
]


def from_fields(cls, data: dict):
    """``cls(**data)`` keeping only the fields ``cls`` knows (records read from older files)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


# -- an engine, as it describes itself --------------------------------------------------------
@dataclass(frozen=True)
class GpuInfo:
    """One GPU an engine can see."""

    name: str
    memory: int  # bytes


@dataclass(frozen=True)
class Inventory:
    """What a fresh engine says about itself (``worker.api.setup``): the notebook places ranks
    by it, checks one environment across hosts with it, and ``%nbdist status`` shows it."""

    host: str  # the host's name as the notebook named it (remote engines), else its own
    pid: int
    threads: int
    gpus: tuple[GpuInfo, ...] = ()
    cuda_visible: str | None = None  # this engine's slice of CUDA_VISIBLE_DEVICES
    python: str = ""
    torch: str = ""
    nbdist: str = ""
    executable: str = ""
    host_index: int | None = None  # the host's position in the user's host list (remote)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Inventory:
        gpus = tuple(GpuInfo(**g) for g in data.get("gpus") or ())
        return from_fields(cls, {**data, "gpus": gpus})


# -- a rank ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RankInfo:
    """The torchrun-compatible description of one rank, sent with each group formation."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    group_rank: int  # index of this rank's host among the hosts
    master_addr: str
    master_port: int
    backend: str  # gloo | nccl
    device: str  # "cpu" or "cuda:<local_rank>"
    attempt: int = 0  # times the process group has been formed; names its store namespace

    def environ(self) -> dict[str, str]:
        """The variables torchrun sets for a worker, plus the agent-store switch."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.group_rank),
            "ROLE_RANK": str(self.rank),
            "ROLE_WORLD_SIZE": str(self.world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            # The store on MASTER_PORT is already served (by rank 0's engine, as torchrun's agent
            # serves it), so every rank connects as a client, under a fresh prefix per attempt.
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCHELASTIC_RESTART_COUNT": str(self.attempt),
        }

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RankInfo:
        return from_fields(cls, data)


@dataclass(frozen=True)
class EngineIdentity:
    """An engine's answer to "who are you?" (``worker.api.identity``), used to attach."""

    pid: int
    host: str
    info: RankInfo | None  # None before any group was formed there
    formed: bool  # the process group stands on this engine


# -- a cell ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Program:
    """What the ranks run: a ``%%distributed`` cell, or a script (``%nbdist run FILE ARGS``).

    A cell is IPython source (magics allowed) run in the engine's namespace; a script is plain
    Python run as ``__main__``, as ``python FILE`` would run it (see ``worker.script``).
    """

    source: str
    filename: str  # in tracebacks: <distributed-cell-N>, or the script's absolute path
    argv: tuple[str, ...]  # sys.argv while it runs: (cell name,) or (FILE, *ARGS)
    script: bool = False
    cwd: str | None = None  # the notebook's working folder, used where it exists

    @property
    def name(self) -> str:
        """How the person refers to it: the file as typed, or the cell's name."""
        return self.argv[0] if self.argv else self.filename


@dataclass(frozen=True)
class TrialInfo:
    """One trial of a sweep, sent with its cell: ``values`` are defined as names in the cell's
    namespace first, and ``nbdist.trial()`` returns this record."""

    sweep: str  # the sweep's name (``--name``), or its run key
    trial: int  # the trial's id, 0.. in trial order
    values: dict[str, Any]  # the swept names and this trial's values (plain literals)
    attempt: int = 0  # times this trial was started again (``--restarts``)


@dataclass(frozen=True)
class CellRequest:
    """One ``%%distributed`` cell (or script) for one rank."""

    program: Program
    options: CellOptions = CellOptions()  # the cell's options, whole: each read where it acts
    run_key: str = "default"  # names the run's checkpoints; kept across restarts and replays
    run_id: str = ""  # the run (default: run_key): checkpoints another run wrote move aside
    group: RankInfo | None = None  # re-form the process group first, as this rank
    want_value: bool = False  # send the last expression's value back (the main rank)
    group_timeout: float = 300.0
    trial: TrialInfo | None = None  # a sweep's trial: its group is ``group``, of its own ranks
    telemetry: bool = True  # send report()'s records and health: the kernel watches the run
    rebind: bool = False  # every rank of the world runs it: bind earlier objects to its group


@dataclass(frozen=True)
class PackedValue:
    """A value on its way to the notebook: pickled on the engine (None when it could not be),
    always with its repr, unpickled in the kernel's main thread (``notebook.transfer``)."""

    repr: str
    pickle: bytes | None = None


@dataclass(frozen=True)
class CellOutcome:
    """How a cell ended on one rank.

    ``kind``: ``ok``; ``error`` (the cell raised); ``interrupted``; ``storage`` (a checkpoint
    could not be written: retried by ``--restarts``); and, made by the kernel for a rank that
    could not answer, ``died`` (its engine is gone), ``hung`` (killed for not stopping) or
    ``timeout`` (stopped by ``--timeout``).
    """

    kind: str
    at: float  # engine clock when it ended
    value: PackedValue | None = None
    summary: str = ""  # one line: the exception, or why the rank was lost
    traceback: str = ""  # the user's frames only
    group_formed: bool = False  # the process group still stands on this rank
    pipeline: PipelineRole | None = None  # the rank's stage in its latest nbdist.pipeline
    mesh: MeshCoords | None = None  # the rank's coordinates in its latest nbdist.mesh
    profile: ProfileResult | None = None  # what torch.profiler saw, when the cell asked
    collectives: int = 0  # collectives it entered in the cell, as counted (collectives.counting)
    printed: bool = True  # it wrote or displayed something (else no output can trail the reply)

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


# -- data ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShardMeta:
    """What the notebook sends with a shard: enough for a loader to match every other rank."""

    name: str
    rank: int
    world_size: int
    sizes: tuple[int, ...]  # rows on every rank, repeated (pad) rows included
    pads: tuple[int, ...]  # repeated rows at the end of each rank's shard
    total: int  # rows of the notebook's data set
    seed: int
    shuffle: bool
    stratified: bool
    remainder: str  # drop | pad | uneven


@dataclass(frozen=True)
class ValueInfo:
    """What an engine says of one of its variables before ``gather`` asks for it: its type,
    and for arrays and tensors (or a tuple of them) their shapes, dtypes and total bytes."""

    type: str
    ok: bool  # an array, a tensor, or a non-empty tuple of them: it can travel as raw buffers
    is_tuple: bool = False
    shapes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[str, ...] = ()
    nbytes: int = 0


# -- looking inside a rank (``notebook.debug``, ``worker.debug``) ---------------------------------
@dataclass(frozen=True)
class ProfileResult:
    """What torch.profiler saw on one rank over a cell (or its first steps): the window's wall
    time and steps (``report()`` calls), seconds waiting for data, each collective's seconds in
    the order they started (matched across ranks by that order: SPMD), and the rank's Chrome
    trace, gzip-compressed JSON (None when too large to send)."""

    steps: int
    seconds: float
    data: float
    collectives: tuple[float, ...]
    trace: bytes | None = None


@dataclass(frozen=True)
class FrameRecord:
    """One frame of a rank's stack as the notebook shows it: where, and (for a kept failure)
    each local's repr, bounded. ``user``: the person's code (a cell, a script, their modules),
    not nbdist's, a library's or Python's own."""

    file: str
    line: int
    function: str
    source: str = ""  # the line's text, stripped
    locals: tuple[tuple[str, str], ...] = ()
    user: bool = True


@dataclass(frozen=True)
class PostMortem:
    """A failed cell's frames on one rank, kept there until its next cell: the person's frames,
    outermost first, the one that raised last (``nbdist.post_mortem``)."""

    rank: int
    summary: str  # the exception, one line: "KeyError: 'b'"
    frames: tuple[FrameRecord, ...]


#: Data-publication keys of stacks an engine sends while a cell runs: ``STACKS_KEY`` + pid:seq.
STACKS_KEY = "nbdist-stacks:"
#: The signal that asks an engine for its stacks: one whose default action is to be ignored, so
#: that code resetting every handler (Lightning restores each signal's as it found it, and finds
#: faulthandler's as SIG_DFL) turns the request into nothing, not into the engine's death.
STACKS_SIGNAL = signal.SIGWINCH


@dataclass(frozen=True)
class ThreadStack:
    """One thread's Python stack, outermost frame first."""

    name: str
    frames: tuple[FrameRecord, ...]
    main: bool = False  # the thread that runs the cells


@dataclass(frozen=True)
class RankStacks:
    """Where one rank's threads were: ``how`` they were read (``faulthandler``: a signal, even
    in C code; ``engine``: asked between cells; ``py-spy``: from outside the process)."""

    rank: int
    threads: tuple[ThreadStack, ...]
    how: str = "faulthandler"
    collectives: int = -1  # collectives it entered in the running cell (-1: not known)
    in_collective: str = ""  # the one it is in now ("" when none)


@dataclass(frozen=True)
class DebugReply:
    """What one pdb command printed on the failed rank, and whether the session has ended."""

    output: str
    done: bool = False
