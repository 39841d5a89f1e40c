"""Everything an engine remembers between requests, in one place.

An engine is one long-lived process (one rank) that runs many cells. What it must remember
from one request to the next lives on the single ``engine`` object below, not in module
globals scattered over the worker package, so a reader sees the whole of it here and a test
can reset it. The user's own variables live in the engine shell's namespace (``namespace()``).
"""

from __future__ import annotations

import socket
import sys
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..protocol import MeshCoords, PipelineRole, RankInfo, ShardMeta, TrialInfo


@dataclass
class Engine:
    """This engine's state. One instance per process: ``engine``."""

    rank_info: RankInfo | None = None
    """This engine's rank, set at each group formation (``rendezvous.form``)."""
    run_key: str = "default"
    """The running cell's run, which names its checkpoint folder (kept across restarts)."""
    run_id: str = "default"
    """The run itself: the same across its restarts and replays, new for each run of a cell."""
    resume: bool = False
    """Whether the run may continue an earlier run's checkpoints (``--resume``)."""
    claimed: set = field(default_factory=set)
    """(folder, run id) of the checkpoint folders this engine claimed (``checkpoint.files``)."""
    store: Any = None
    """The rendezvous TCPStore server; rank 0's engine only, for as long as the engine lives."""
    store_socket: socket.socket | None = None
    """The socket the store serves on (kept open as long as the store is)."""
    trial_store: tuple | None = None
    """(store, socket) of the sweep trial whose group this engine leads, until the next one."""
    formations: int = 0
    """Groups formed in this attempt; the same count on every rank (SPMD), names store keys."""
    pin_cores: bool = False
    """Whether a CPU rank is pinned to its share of the host's cores at each formation
    (``host.pin``; set by ``api.setup``)."""
    shared_memory: bool = False
    """Whether DDP models on CPU all-reduce through shared memory where every rank shares this
    host (``collectives.group``; set by ``api.setup``)."""
    local_group: Any = None
    """This formation's ``collectives.group.LocalGroup``, made by its first DDP model on CPU."""
    group_log: Any = None
    """The groups this formation made beside its default one, in order (``groups.Log``)."""
    previous_groups: Any = None
    """The last formation's ``groups.Log``, until the objects made over it are bound to this
    one (``continuity``)."""
    rebound: tuple | None = None
    """The formation the objects were last bound to (``continuity``): another one stands since?"""
    bound: list = field(default_factory=list)
    """The objects bound to a formation's groups (DDP models, FSDP modules, meshes, pipeline
    stages), in the order they were made: each a ``groups.Bound`` (held weakly)."""
    retired_groups: list = field(default_factory=list)
    """Groups the user's code destroyed, kept alive until the next formation (see
    ``rendezvous._deferred_destroy``: freeing one too soon can deadlock the engine)."""
    group_sockets: set = field(default_factory=set)
    """(fd, local, remote) of the group's TCP connections, shut down on abort."""
    held_groups: list = field(default_factory=list)
    """Aborted groups still used by a model, with the socket numbers held for them
    (``rendezvous.abort``: freed, and the numbers let go, once nothing else holds them)."""
    pending_shards: dict[str, tuple[Any, ShardMeta]] = field(default_factory=dict)
    """Shards received but not yet committed, by scatter token."""
    shards: dict[str, ShardMeta] = field(default_factory=dict)
    """What was scattered under each name (for ``nbdist.loader``)."""
    restored: dict = field(default_factory=dict)
    """Plain values from the last ``nbdist.restore`` (``nbdist.restored()``)."""
    training_plans: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)
    """What ``train_step`` must know of each prepared model, kept beside it (``training``)."""
    pipeline: PipelineRole | None = None
    """This rank's stage in the latest ``nbdist.pipeline`` (shown by ``%nbdist status``)."""
    mesh: MeshCoords | None = None
    """This rank's coordinates in the latest ``nbdist.mesh`` over the current group (shown by
    ``%nbdist status``, the dashboard and the sidebar); none once the group is formed again."""
    meshes: dict = field(default_factory=dict)
    """The device meshes made over the current process group, by shape (``mesh.grid``)."""
    pipeline_idle: float | None = None
    """The share of the latest pipeline step this stage spent waiting (the dashboard's idle)."""
    trial: TrialInfo | None = None
    """The sweep trial the running cell is (``nbdist.trial()``); None outside a sweep."""
    trial_spaces: dict[int, dict] = field(default_factory=dict)
    """The names each trial's cell bound here, by trial id (``%nbdist pull NAME --trial``)."""
    pipeline_parts: weakref.WeakSet = field(default_factory=weakref.WeakSet)
    """Every pipeline stage module on this engine: checkpoints save them per rank."""
    program_file: str = ""
    """The running (or last) cell's file name, or its script's: its frames are the person's."""
    cluster_id: str = ""
    """The cluster this engine belongs to (``api.setup``): where its rank's state is kept."""
    kept_mark: Any = None
    """The fingerprint of the names when this rank's state was last kept (``snapshot``)."""
    kept_note: str = ""
    """The last line said about keeping this rank's state (not said again at every cell)."""
    unkept: dict = field(default_factory=dict)
    """Names whose values could not be pickled, and those values' ids (not tried again)."""
    collective_calls: int = 0
    """Collectives this rank entered in the running cell (``collectives.counting``)."""
    in_collective: str = ""
    """The collective this rank is in now ("" when none)."""
    failure: Any = None
    """The last cell's exception, its frames alive, until the next cell (``debug.postmortem``)."""
    debugger: Any = None
    """The pdb session over ``failure``, while ``%nbdist debug`` has one open."""


engine = Engine()


def namespace() -> dict:
    """The user's namespace on this engine: where cells run and variables persist."""
    from IPython import get_ipython

    shell = get_ipython()
    return shell.user_ns if shell is not None else sys.modules["__main__"].__dict__
