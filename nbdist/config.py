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
    start_timeout: float = 60.0
    """Seconds to wait for all engines to register."""
    ip: str = "127.0.0.1"
    """Address the controller listens on. Loopback: nothing outside this machine can connect."""
    backend: str | None = None
    """torch.distributed backend; default: nccl when every rank has a GPU, gloo otherwise."""
    group_timeout: float = 300.0
    """Timeout of one collective, in seconds. Failures are caught long before (see README)."""

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
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.timeout is not None and self.timeout <= 0:
            raise UsageError(f"--timeout must be a positive number of seconds, not {self.timeout}")


@dataclass(frozen=True)
class TelemetryConfig:
    """How the notebook watches a running cell: the dashboard's pace and the health verdicts."""

    ui_interval: float = 0.1
    """Seconds between updates of the dashboard's numbers (progress, step, samples/s)."""
    chart_interval: float = 0.4
    """Seconds between redraws of the charts, table and logs (at least twice a second)."""
    store_interval: float = 0.5
    """Seconds between writes to the run store (one transaction each)."""
    silent_after: float = 5.0
    """A rank with no news (heartbeat or, while others report, a report) this long is silent."""
    slow_factor: float = 2.0
    """A rank whose step time exceeds this many times the median is slow (a straggler)."""
    log_lines: int = 5
    """Last lines of each rank's output shown on the dashboard."""

    def __post_init__(self) -> None:
        if min(self.ui_interval, self.chart_interval, self.store_interval) <= 0:
            raise UsageError("telemetry intervals must be positive numbers of seconds")
        if self.silent_after <= 0 or self.slow_factor <= 1:
            raise UsageError("silent_after must be > 0 and slow_factor > 1")
