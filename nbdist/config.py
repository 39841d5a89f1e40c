"""All of nbdist's settings, in one place, with defaults that work on a laptop.

Every setting can be given as an argument; the few that make sense per machine can also come from
an environment variable (named beside it). Values are validated when the object is built, and the
error says how to fix them. A cell's options also declare their words on the ``%%distributed``
line here. The module is longer than the others for that reason: one catalogue, read in one
place, is what a person looks for when they ask what an option does or add one.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

from . import paths
from .errors import UsageError
from .remote_config import HostSpec, RemoteConfig
from .validate import check_local_ip, flag, seconds, whole

__all__ = ["HostSpec", "RemoteConfig", "check_local_ip", "seconds", "whole"]

#: Environment variable naming nbdist's data directory (run store, cluster records, checkpoints).
DATA_DIR_ENV = "NBDIST_DATA_DIR"

#: Environment variable: ``0`` keeps ``%load_ext nbdist`` from starting a spare engine fork server
#: (see ``nbdist.notebook.cluster.engines.forks``).
PREWARM_ENV = "NBDIST_PREWARM"

#: Engines a machine may run per CPU unless ``oversubscribe``: past a few per core they only wait
#: for each other, and 100,000 exhaust memory before any is ready. Four per CPU, never fewer than
#: 8 in all, still lets a laptop rehearse a many-rank run (8 ranks on 2 cores).
ENGINES_PER_CPU = 4
MIN_ENGINE_LIMIT = 8
#: Engines a scheduler (slurm, mpi) may be asked for: its slots are its own; this refuses nonsense.
SCHEDULER_ENGINE_LIMIT = 4096
#: Heartbeat periods (ms) unless ``ClusterConfig.heartbeat_ms`` says otherwise (see there).
LOCAL_HEARTBEAT_MS, REMOTE_HEARTBEAT_MS = 3000, 1000
#: Restarts one cell may use: a worker lost more often has a cause to fix, not to retry.
MAX_RESTARTS = 100
#: The shortest progress deadline: ranks report every 0.5 s (``--refresh``), read as often; less
#: takes healthy ranks for hung. A slower pace needs a deadline of a few of its periods.
MIN_PROGRESS_TIMEOUT = 2.0
#: The pace of a cell's reports and board (``--refresh``): what a browser can follow at most,
#: and still a live board at least.
REFRESH_LIMITS = (0.1, 60.0)


def data_dir() -> Path:
    """Where nbdist keeps its records: ``$NBDIST_DATA_DIR`` or ``~/.local/share/nbdist``."""
    env = os.environ.get(DATA_DIR_ENV)
    return paths.expand(env, DATA_DIR_ENV) if env else Path.home() / ".local/share/nbdist"


def prewarm() -> bool:
    """Whether ``%load_ext nbdist`` starts a spare fork server for the next local start
    (``$NBDIST_PREWARM``: on unless ``0``)."""
    value = os.environ.get(PREWARM_ENV, "1").strip().lower()
    if value in ("1", "true", "yes", "on", ""):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise UsageError(
        f"{PREWARM_ENV}={value!r} is not understood: set it to 1 (a spare engine server at "
        "%load_ext, the default) or 0 (none)"
    )


def cpu_count() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def engine_limit(cpus: int) -> int:
    """Engines a machine with ``cpus`` CPUs may run unless ``oversubscribe`` is given."""
    return max(MIN_ENGINE_LIMIT, ENGINES_PER_CPU * cpus)


def over_cpus(what: str, cpus: int, most: int, where: str = "this machine") -> UsageError:
    """The one line refusing ``what`` (engines, or threads per engine) beyond ``most``."""
    why = f" ({ENGINES_PER_CPU} per CPU, at least {MIN_ENGINE_LIMIT})" if "engines" in what else ""
    return UsageError(
        f"{what}: {where} has {cpus} CPU(s), enough for at most {most}{why}: use fewer, or "
        "add --oversubscribe (oversubscribe=True) if you mean it"
    )


@dataclass(frozen=True)
class ClusterConfig:
    """How to start a cluster of engines on this machine."""

    n: int
    """Number of engines, one rank each."""
    threads_per_engine: int | None = None
    """Intra-op threads per engine; default: this machine's CPUs divided among the engines."""
    heartbeat_ms: int | None = None
    """Controller heartbeat period: every engine and the controller wake at each beat. New
    engines register at once whatever the period (``nbdist.launch.heart``). Default
    (``heartbeat``): 1000 ms for remote engines, whose host's loss is known only from missed
    beats; 3000 ms, ipyparallel's own, for local ones, whose death is known at once from
    their fork server (at 1 s, the beat was a third of an idle local cluster's CPU)."""
    heartbeat_misses: int = 4
    """Missed heartbeats before an engine counts as lost (beats after the 4th miss: a remote
    host gone for 5-6 s)."""
    start_timeout: float = 60.0
    """Seconds to wait for all engines to register."""
    ip: str = "127.0.0.1"
    """Address the controller listens on. Loopback: nothing outside this machine can connect."""
    backend: str | None = None
    """torch.distributed backend; default: nccl when every rank has a GPU, gloo otherwise."""
    group_timeout: float = 300.0
    """Timeout of one collective, in seconds. Failures are caught long before (see README)."""
    allow_mixed: bool = False
    """Allow ranks without a GPU beside ranks with one (gloo on CPU everywhere, with a warning)."""
    remote: RemoteConfig | None = None
    """Engines on other hosts or through a scheduler (see RemoteConfig); None: this machine."""
    oversubscribe: bool = False
    """Allow more engines (or threads) than the machines' CPUs can serve (``engine_limit``)."""
    pin_cores: bool = True
    """Pin each CPU rank to its own share of its host's cores (``worker.host``), when the
    host's ranks fit its cores; False leaves the placement of threads to the OS."""
    shared_memory: bool = True
    """DDP models on CPU all-reduce their gradients through shared memory where every rank
    shares a host (``worker.collectives``); False leaves them on gloo's TCP, as torchrun does."""

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise numpy integers and the like to int
        set_(self, "n", whole(self.n, "the number of engines", 1))
        if (threads := self.threads_per_engine) is not None:
            set_(self, "threads_per_engine", whole(threads, "threads_per_engine (--threads)", 1))
        if self.heartbeat_ms is not None:
            set_(self, "heartbeat_ms", whole(self.heartbeat_ms, "heartbeat_ms", 10, 60_000))
        set_(self, "heartbeat_misses", whole(self.heartbeat_misses, "heartbeat_misses", 1))
        set_(self, "start_timeout", seconds(self.start_timeout, "start_timeout"))
        set_(self, "group_timeout", seconds(self.group_timeout, "group_timeout"))
        if self.backend not in (None, "gloo", "nccl"):
            raise UsageError(f"backend must be 'gloo' or 'nccl', not {self.backend!r}")
        flag(self.allow_mixed, "allow_mixed")
        flag(self.oversubscribe, "oversubscribe")
        flag(self.pin_cores, "pin_cores")
        flag(self.shared_memory, "shared_memory")
        if self.remote is not None and not isinstance(self.remote, RemoteConfig):
            raise UsageError(f"remote must be a RemoteConfig, not {type(self.remote).__name__}")
        if self.remote is None:
            check_local_ip(self.ip)
        elif not isinstance(self.ip, str):
            raise UsageError(f"ip must be an address, not {self.ip!r}")
        self._check_bounds()

    def _check_bounds(self) -> None:
        """Engines and threads within what the machines can run, unless oversubscribed. Hosts
        over SSH are checked once their CPUs are known (``engines.remote.checks``)."""
        if self.oversubscribe:
            return
        launcher = self.remote.launcher if self.remote is not None else "local"
        if launcher == "local":
            cpus = cpu_count()
            if self.n > engine_limit(cpus):
                raise over_cpus(f"{self.n} engines", cpus, engine_limit(cpus))
            if (self.threads_per_engine or 0) > cpus:
                raise over_cpus(f"{self.threads_per_engine} threads per engine", cpus, cpus)
        elif launcher != "ssh" and self.n > SCHEDULER_ENGINE_LIMIT:
            raise UsageError(
                f"{self.n} engines from {launcher}: more than {SCHEDULER_ENGINE_LIMIT}, which "
                "nobody means by accident: use fewer, or add --oversubscribe if you mean it"
            )

    @property
    def heartbeat(self) -> int:
        """The heartbeat period in ms: the one given, else the default for these engines."""
        if self.heartbeat_ms is not None:
            return self.heartbeat_ms
        return LOCAL_HEARTBEAT_MS if self.remote is None else REMOTE_HEARTBEAT_MS

    @property
    def threads(self) -> int:
        """Threads each engine uses: the given number, or a fair share of this machine's CPUs."""
        return self.threads_per_engine or max(1, cpu_count() // self.n)


#: The experiment trackers ``--track`` takes (``notebook.trackers.sinks`` has one sink each).
TRACKERS = ("mlflow", "wandb", "comet")
#: The most steps ``--total`` may name: the dashboard's numbers stay exact (below 2**53).
MAX_TOTAL = 10**15


def _flag(*names: str, **kw: object) -> dict:
    """A cell option's words on the ``%%distributed`` line and ``argparse``'s ``add_argument``
    keywords for them: the magics build their parser from these, so an option is declared once,
    here."""
    return {"flag": names, "argparse": kw}


def _ranks_text(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(r) for r in text.split(",") if r.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ranks like 0,2 not {text!r}") from None


def positive(text: str) -> int:
    """A command line's whole number >= 1 (at most ``MAX_TOTAL``), or argparse's one line."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, not {text!r}")
    if value > MAX_TOTAL:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_TOTAL:.0e} steps, not {text!r}")
    return value


def _profile_steps(text: str) -> int | bool:
    if text == "all":
        return True
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of steps, not {text!r}") from None


@dataclass(frozen=True)
class CellOptions:
    """Options of one ``%%distributed`` cell (and of ``%nbdist run``, ``nbdist.run_script``).

    Each field with a ``flag`` in its metadata is a word of the magics' line, parsed as its
    metadata says (``notebook.magics`` builds the parser from these fields); every field is
    checked here, when the options are made. The options travel whole to the engines
    (``protocol.CellRequest.options``) and to the run's observers (``notebook.run.observers``),
    so an option a rank or a board acts on is read where it acts, and declared nowhere else.
    """

    timeout: float | None = field(
        default=None, metadata=_flag("--timeout", type=float, help="stop the cell after SECONDS")
    )
    """Stop the cell on every rank after this many seconds."""
    ranks: tuple[int, ...] | None = field(
        default=None,
        metadata=_flag("--ranks", type=_ranks_text, help="run on these ranks only: 0,2"),
    )
    """Run on these ranks only (for cells without collectives)."""
    all_output: bool = field(
        default=False,
        metadata=_flag("--all-output", action="store_true", help="show every rank's output"),
    )
    """Show every rank's output, each line labelled with its rank (default: rank 0's only)."""
    grace: float = 3.0
    """After one rank fails, seconds the others get to finish before they are interrupted."""
    stop_wait: float = 10.0
    """Seconds an interrupted rank gets to stop before its engine is replaced."""
    restarts: int = field(
        default=0, metadata=_flag("--restarts", type=int, help="replace lost workers up to R times")
    )
    """Times a lost worker (dead, hung, host gone) is replaced and the cell resumed."""
    min_workers: int | None = field(
        default=None, metadata=_flag("--min-workers", type=int, help="shrink to no fewer than M")
    )
    """With restarts: if a lost worker cannot be replaced, go on with at least this many ranks."""
    progress_timeout: float = field(
        default=300.0,
        metadata=_flag(
            "--progress-timeout",
            type=float,
            help="seconds without progress before a rank counts as hung",
        ),
    )
    """Progress deadline: a rank that reported steps and then made none for this long is hung
    (a deadlock in a collective); it is killed, and replaced when --restarts allows."""
    quiet: bool = False
    """Show no output (used when earlier cells are replayed on fresh engines)."""
    profile: int | bool = field(
        default=False,
        metadata=_flag(
            "--profile",
            nargs="?",
            const=True,
            type=_profile_steps,
            metavar="STEPS",
            help="torch.profiler on every rank: the whole cell, or its first STEPS steps",
        ),
    )
    """torch.profiler on every rank: True for the whole cell, N for its first N steps."""
    resume: bool = field(
        default=False,
        metadata=_flag(
            "--resume",
            action="store_true",
            help="continue an earlier run's checkpoints of the same name (run=, a sweep's --name)",
        ),
    )
    """Continue an earlier run's checkpoints under the same name (``run=``, a sweep's name);
    without it a new run starts afresh and those move aside."""
    name: str = field(
        default="", metadata=_flag("--name", help="a name for this run in nbdist.runs()")
    )
    """The run's name in the run store, the sidebar and the trackers ("": unnamed; a script's
    run is named for its file)."""
    dashboard: bool = field(
        default=True,
        metadata=_flag("--no-dashboard", action="store_false", help="no live dashboard widget"),
    )
    """Show the live dashboard under the cell (a sweep: its board)."""
    total: int | None = field(
        default=None, metadata=_flag("--total", type=positive, help="steps in all, for the ETA")
    )
    """Steps the run will take in all: the dashboard's progress and ETA."""
    tensorboard: str | None = field(
        default=None,
        metadata=_flag("--tensorboard", metavar="DIR", help="also write TensorBoard logs"),
    )
    """Also write the run's metrics as TensorBoard logs into this folder."""
    stop_on_nan: bool = field(
        default=False,
        metadata=_flag(
            "--stop-on-nan", action="store_true", help="stop every rank on a NaN/inf loss"
        ),
    )
    """Stop every rank as soon as one reports a loss that is not finite."""
    refresh: float = field(
        default=0.5,
        metadata=_flag(
            "--refresh",
            type=float,
            metavar="SECONDS",
            help="how often the ranks send their reports and the board redraws (default 0.5)",
        ),
    )
    """Seconds between the ranks' batches of reports (and health samples) and between the
    board's redraws: a slower pace costs the kernel less at many ranks (each batch costs the
    engine, the controller and the kernel about a millisecond)."""
    track: tuple[str, ...] = field(
        default=(),
        metadata=_flag(
            "--track", action="append", default=None, help="also send it to mlflow, wandb or comet"
        ),
    )
    """Experiment trackers that also get the run (``TRACKERS``; ``"mlflow,wandb"`` or a list)."""

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise what the Python API may pass
        if self.timeout is not None:
            fix = " (leave --timeout out for none)"
            set_(self, "timeout", seconds(self.timeout, "--timeout", fix=fix))
        if self.ranks is not None:
            set_(self, "ranks", _rank_list(self.ranks))
        for name in ("all_output", "quiet", "resume", "dashboard", "stop_on_nan"):
            flag(getattr(self, name), name)
        set_(self, "grace", seconds(self.grace, "grace", zero=True))
        set_(self, "stop_wait", seconds(self.stop_wait, "stop_wait", zero=True))
        set_(self, "restarts", whole(self.restarts, "--restarts", 0, MAX_RESTARTS))
        if self.min_workers is not None:
            set_(self, "min_workers", whole(self.min_workers, "--min-workers", 1))
            if not self.restarts:
                raise UsageError(
                    "--min-workers only acts when a lost worker is not replaced: add --restarts R"
                )
        low, high = REFRESH_LIMITS
        set_(self, "refresh", seconds(self.refresh, "--refresh", low, " (at most 60)"))
        if self.refresh > high:
            raise UsageError(f"--refresh must be at most {high:g} s, not {self.refresh!r}")
        low = max(MIN_PROGRESS_TIMEOUT, 4 * self.refresh)
        fix = f" (reports come every {self.refresh:g} s: --refresh)"
        set_(
            self, "progress_timeout", seconds(self.progress_timeout, "--progress-timeout", low, fix)
        )
        if not isinstance(self.profile, bool):  # True: the whole cell; N: its first N steps
            set_(self, "profile", whole(self.profile, "--profile STEPS", 1))
        if not isinstance(self.name, str):
            raise UsageError(f"name must be text, not {self.name!r:.60}")
        if self.total is not None:
            set_(self, "total", whole(self.total, "--total", 1, MAX_TOTAL))
        if self.tensorboard is not None and not (
            isinstance(self.tensorboard, str) and self.tensorboard.strip()
        ):
            raise UsageError(f"--tensorboard takes a folder, not {self.tensorboard!r:.60}")
        set_(self, "track", tracker_names(self.track))


def tracker_names(track: object) -> tuple[str, ...]:
    """``--track``'s value (``"mlflow,wandb"``, a list of such) as tracker names, each once;
    an unknown name is one line listing the known ones."""
    if not track:
        return ()
    items = [track] if isinstance(track, str) else track
    if not isinstance(items, (list, tuple)) or not all(isinstance(t, str) for t in items):
        raise UsageError(f"--track takes tracker names like mlflow,wandb, not {track!r:.60}")
    out: list[str] = []
    for name in (n.strip().lower() for t in items for n in t.split(",")):
        if name and name not in out:
            out.append(name)
    bad = [n for n in out if n not in TRACKERS]
    if bad:
        raise UsageError(f"--track {bad[0]!r}: choose from {', '.join(TRACKERS)}")
    return tuple(out)


def cell_flags() -> list[tuple[str, tuple[str, ...], dict]]:
    """Each cell option's field name, its words and ``add_argument``'s keywords (its default
    the field's, unless it says otherwise), in order."""
    return [
        (
            f.name,
            f.metadata["flag"],
            {"dest": f.name, "default": f.default, **f.metadata["argparse"]},
        )
        for f in fields(CellOptions)
        if "flag" in f.metadata
    ]


def _rank_list(ranks: object) -> tuple[int, ...]:
    """``--ranks`` as a tuple of distinct whole numbers >= 0, or one line naming the mistake."""
    if not isinstance(ranks, (tuple, list)):
        raise UsageError(f"--ranks must be a list of ranks like (0, 2), not {ranks!r}")
    out = tuple(whole(r, "each of --ranks", 0) for r in ranks)
    if not out:
        raise UsageError("--ranks names no rank: name some, like 0,2 (or leave it out for all)")
    twice = sorted({r for r in out if out.count(r) > 1})
    if twice:
        raise UsageError(
            f"--ranks names rank(s) {', '.join(map(str, twice))} twice: name each rank once"
        )
    return out


@dataclass(frozen=True)
class TelemetryConfig:
    """How the notebook watches a running cell: the health verdicts, the run store's pace (the
    board's is the cell's ``--refresh``)."""

    store_interval: float = 0.5
    """Seconds between writes to the run store (one transaction each)."""
    silent_after: float = 5.0
    """A rank with no news (heartbeat or, while others report, a report) this long is silent."""
    slow_factor: float = 2.0
    """A rank whose step time exceeds this many times the median is slow (a straggler)."""
    log_lines: int = 5
    """Last lines of each rank's output shown on the dashboard."""

    def __post_init__(self) -> None:
        for name in ("store_interval", "silent_after"):
            seconds(getattr(self, name), name)
        if not (isinstance(self.slow_factor, (int, float)) and 1 < self.slow_factor < math.inf):
            raise UsageError(f"slow_factor must be a number > 1, not {self.slow_factor!r}")
        whole(self.log_lines, "log_lines", 0)


@dataclass(frozen=True)
class Retention:
    """What ``nbdist.gc()`` (``%nbdist gc``) keeps in the data folder; the rest it may free. What
    is in use (a running cluster's files, a running run's checkpoints) is kept whatever this says.
    The defaults suit a laptop."""

    keep_checkpoints: int = 10
    """Checkpoint folders kept: those of the last N runs, by their last write."""
    keep_runs: int = 100
    """Runs kept in the run store (with their profiles): the newest N, and ..."""
    keep_days: float = 14.0
    """... every run started in the last D days."""
    keep_logs: int = 10
    """Log folders kept of clusters that are gone: the last N clusters' (a running one's too)."""
    log_bytes: int = 10 * 2**20
    """A log that grows past this is rotated: its latest part kept in ``<log>.1``, itself
    emptied (checked every few seconds while its cluster runs, and by gc)."""

    def __post_init__(self) -> None:
        for name in ("keep_checkpoints", "keep_runs", "keep_logs"):
            whole(getattr(self, name), name, 0)
        days = self.keep_days
        if isinstance(days, bool) or not isinstance(days, (int, float)) or not 0 <= days < 1e6:
            raise UsageError(f"keep_days must be a number of days >= 0, not {days!r}")
        whole(self.log_bytes, "log_bytes", 4096)
