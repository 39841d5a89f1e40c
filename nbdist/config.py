"""All of nbdist's settings, in one place, with defaults that work on a laptop.

Every setting can be given as an argument; the few that make sense per machine can also come from
an environment variable (named beside it). Values are validated when the object is built, and the
error says how to fix them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import UsageError

#: Environment variable naming nbdist's data directory (run store, cluster records, checkpoints).
DATA_DIR_ENV = "NBDIST_DATA_DIR"


def data_dir() -> Path:
    """Where nbdist keeps its records: ``$NBDIST_DATA_DIR`` or ``~/.local/share/nbdist``."""
    env = os.environ.get(DATA_DIR_ENV)
    base = Path(env) if env else Path.home() / ".local" / "share" / "nbdist"
    return base.expanduser()


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class ClusterConfig:
    """How to start a cluster of engines on this machine."""

    n: int
    """Number of engines, one rank each."""
    threads_per_engine: int | None = None
    """Intra-op threads per engine; default: this machine's CPUs divided among the engines."""
    heartbeat_ms: int = 200
    """Controller heartbeat period. ipyparallel's 3 s default makes start-up take ~6 s."""
    heartbeat_misses: int = 25
    """Missed heartbeats before an engine counts as lost (25 x 200 ms: a host gone for 5 s)."""
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

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            raise UsageError(f"the number of engines must be a whole number >= 1, not {self.n!r}")
        if self.threads_per_engine is not None and self.threads_per_engine < 1:
            raise UsageError("threads_per_engine must be >= 1 (or None for a fair share)")
        if self.backend not in (None, "gloo", "nccl"):
            raise UsageError(f"backend must be 'gloo' or 'nccl', not {self.backend!r}")

    @property
    def threads(self) -> int:
        """Threads each engine uses: the given number, or a fair share of this machine's CPUs."""
        return self.threads_per_engine or max(1, _cpu_count() // self.n)


@dataclass(frozen=True)
class CellOptions:
    """Options of one ``%%distributed`` cell."""

    timeout: float | None = None
    """Stop the cell on every rank after this many seconds."""
    ranks: tuple[int, ...] | None = None
    """Run on these ranks only (for cells without collectives)."""
    all_output: bool = False
    """Show every rank's output, each line labelled with its rank (default: rank 0's only)."""
    grace: float = 3.0
    """After one rank fails, seconds the others get to finish before they are interrupted."""
    stop_wait: float = 10.0
    """Seconds an interrupted rank gets to stop before its engine is replaced."""
    restarts: int = 0
    """Times a lost worker (dead, hung, host gone) is replaced and the cell resumed."""
    min_workers: int | None = None
    """With restarts: if a lost worker cannot be replaced, go on with at least this many ranks."""
    progress_timeout: float = 300.0
    """Progress deadline: a rank that reported steps and then made none for this long is hung
    (a deadlock in a collective); it is killed, and replaced when --restarts allows."""
    quiet: bool = False
    """Show no output (used when earlier cells are replayed on fresh engines)."""
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.timeout is not None and self.timeout <= 0:
            raise UsageError(f"--timeout must be a positive number of seconds, not {self.timeout}")
        if self.restarts < 0:
            raise UsageError(f"--restarts must be a whole number >= 0, not {self.restarts}")
        if self.min_workers is not None and self.min_workers < 1:
            raise UsageError(f"--min-workers must be >= 1, not {self.min_workers}")


@dataclass(frozen=True)
class TelemetryConfig:
    """How the notebook watches a running cell: the dashboard's pace and the health verdicts."""

    ui_interval: float = 0.25
    """Seconds between the dashboard's updates: what changed goes to the browser, which draws."""
    store_interval: float = 0.5
    """Seconds between writes to the run store (one transaction each)."""
    silent_after: float = 5.0
    """A rank with no news (heartbeat or, while others report, a report) this long is silent."""
    slow_factor: float = 2.0
    """A rank whose step time exceeds this many times the median is slow (a straggler)."""
    log_lines: int = 5
    """Last lines of each rank's output shown on the dashboard."""

    def __post_init__(self) -> None:
        if min(self.ui_interval, self.store_interval) <= 0:
            raise UsageError("telemetry intervals must be positive numbers of seconds")
        if self.silent_after <= 0 or self.slow_factor <= 1:
            raise UsageError("silent_after must be > 0 and slow_factor > 1")


_LAUNCHERS = ("ssh", "slurm", "mpi", "local")


@dataclass(frozen=True)
class HostSpec:
    """One machine that runs engines, reached over SSH (an alias from ~/.ssh/config works)."""

    name: str
    """Host name or address, as ssh takes it."""
    engines: int = 1
    """Engines (ranks) on this host."""
    user: str | None = None
    """SSH user; default: ssh's (your ~/.ssh/config, else your local user name)."""
    port: int | None = None
    """SSH port; default: ssh's."""
    python: str = "python3"
    """The Python on that host that has nbdist, torch and ipyparallel installed."""
    ssh_options: tuple[str, ...] = ()
    """Extra ssh arguments, e.g. ("-i", "~/.ssh/id_gpu")."""
    interface: str | None = None
    """Network interface the ranks talk over (e.g. "ib0"); default: the one facing the notebook."""
    address: str | None = None
    """This host's address as the other hosts reach it; default: that of ``interface``."""
    environment: dict = field(default_factory=dict)
    """Extra environment variables for its engines (e.g. CUDA_VISIBLE_DEVICES, NCCL_DEBUG)."""

    def __post_init__(self) -> None:
        if not self.name or any(c.isspace() or c in "@/,'\"" for c in self.name):
            raise UsageError(f"{self.name!r} is not a host name: write hosts as user@host:engines")
        if not isinstance(self.engines, int) or isinstance(self.engines, bool) or self.engines < 1:
            raise UsageError(f"host {self.name}: engines must be a whole number >= 1")
        if self.port is not None and not 0 < self.port < 65536:
            raise UsageError(f"host {self.name}: port must be between 1 and 65535, not {self.port}")
        if not self.python:
            raise UsageError(f"host {self.name}: name the Python to run there (python = ...)")

    @property
    def location(self) -> str:
        """``user@name`` (or ``name``), as ssh takes it."""
        return f"{self.user}@{self.name}" if self.user else self.name


@dataclass(frozen=True)
class RemoteConfig:
    """Engines started by one of ipyparallel's launchers: over SSH, or through a scheduler."""

    launcher: str = "ssh"
    """ssh (hosts named here), slurm, mpi, or local (ipyparallel's own local launcher)."""
    hosts: tuple[HostSpec, ...] = ()
    """The SSH hosts (ssh launcher only)."""
    launcher_options: dict = field(default_factory=dict)
    """Options of ipyparallel's engine launcher, e.g. {"account": "ml"} for slurm."""
    ip: str | None = None
    """Controller address; default: the address the hosts reach this machine by. "*": every
    interface (only when asked: the controller is then reachable from anywhere)."""
    connect_timeout: float = 10.0
    """Seconds ssh gets to reach a host: a host that does not answer fails within this."""
    env_check: str = "refuse"
    """When hosts differ in Python, torch, nbdist or CUDA: "refuse" to start, or "warn"."""
    remote_dir: str = ".cache/nbdist"
    """Directory on the hosts (relative to the home directory) for a cluster's engine logs;
    each cluster's own folder there is removed when it stops."""

    def __post_init__(self) -> None:
        if self.launcher not in _LAUNCHERS:
            raise UsageError(
                f"--launcher must be one of {', '.join(_LAUNCHERS)}, not {self.launcher!r}"
            )
        if self.launcher == "ssh" and not self.hosts:
            raise UsageError("the ssh launcher needs hosts: --hosts user@gpu1:4,user@gpu2:4")
        if self.launcher != "ssh" and self.hosts:
            raise UsageError(f"hosts are for the ssh launcher; {self.launcher} finds its own")
        if self.env_check not in ("refuse", "warn"):
            raise UsageError(f"env_check must be 'refuse' or 'warn', not {self.env_check!r}")
        if not self.connect_timeout > 0:
            raise UsageError("connect_timeout must be a positive number of seconds")
        if not self.remote_dir or ".." in self.remote_dir.split("/"):
            raise UsageError(f"remote_dir {self.remote_dir!r}: name a directory without '..'")
