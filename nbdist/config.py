"""All of nbdist's settings, in one place, with defaults that work on a laptop.

Every setting can be given as an argument; the few that make sense per machine can also come from
an environment variable (named beside it). Values are validated when the object is built, and the
error says how to fix them.
"""

from __future__ import annotations

import ipaddress
import math
import numbers
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from . import launcher_config, paths
from .errors import UsageError

#: Environment variable naming nbdist's data directory (run store, cluster records, checkpoints).
DATA_DIR_ENV = "NBDIST_DATA_DIR"

#: Engines a machine may run per CPU unless ``oversubscribe``: past a few per core they only wait
#: for each other, and 100,000 exhaust memory before any is ready. Four per CPU, never fewer than
#: 8 in all, still lets a laptop rehearse a many-rank run (8 ranks on 2 cores).
ENGINES_PER_CPU = 4
MIN_ENGINE_LIMIT = 8
#: Engines a scheduler (slurm, mpi) may be asked for: its slots are its own; this refuses nonsense.
SCHEDULER_ENGINE_LIMIT = 4096
#: Restarts one cell may use: a worker lost more often has a cause to fix, not to retry.
MAX_RESTARTS = 100
#: The shortest progress deadline: ranks report every 200 ms; less takes healthy ranks for hung.
MIN_PROGRESS_TIMEOUT = 1.0


def data_dir() -> Path:
    """Where nbdist keeps its records: ``$NBDIST_DATA_DIR`` or ``~/.local/share/nbdist``."""
    env = os.environ.get(DATA_DIR_ENV)
    return paths.expand(env, DATA_DIR_ENV) if env else Path.home() / ".local/share/nbdist"


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


def whole(value: object, what: str, low: int = 0, high: int | None = None) -> int:
    """``value`` as an int between ``low`` and ``high``, or a UsageError naming ``what``."""
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not ok or value < low or (high is not None and value > high):
        span = f">= {low}" if high is None else f"between {low} and {high}"
        raise UsageError(f"{what} must be a whole number {span}, not {value!r}")
    return int(value)


def seconds(value: object, what: str, low: float = 0.0, fix: str = "", zero: bool = False) -> float:
    """``value`` as a finite number of seconds: > 0 (or >= 0 with ``zero``), or >= ``low``."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < low or (value == 0 and not zero):
        span = f"a number of seconds >= {low:g}" if low or zero else "a positive number of seconds"
        raise UsageError(f"{what} must be {span}{fix}, not {value!r}")
    return float(value)


def _flag(value: object, what: str) -> None:
    if not isinstance(value, bool):
        raise UsageError(f"{what} must be True or False, not {value!r}")


def check_local_ip(ip: object) -> None:
    """Refuse a controller address other than loopback for engines that all run here: the
    controller and rank 0's rendezvous store (which has no authentication) would be open to
    every machine that reaches this one."""
    try:
        addr = ipaddress.ip_address(ip) if isinstance(ip, str) else None
    except ValueError:
        addr = None
    if addr is None and ip != "*":
        raise UsageError(f"--ip {ip!r} is not an IP address: leave --ip out (127.0.0.1)")
    if addr is None or not addr.is_loopback:
        raise UsageError(
            f"--ip {ip} would open the controller and the unauthenticated rendezvous store "
            "beyond this machine, but every engine runs here: leave --ip out (loopback); for "
            "engines on other hosts use --hosts or --cluster-file"
        )
    if addr.version != 4:
        raise UsageError(f"--ip {ip}: local clusters use IPv4: leave --ip out (127.0.0.1)")


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
    oversubscribe: bool = False
    """Allow more engines (or threads) than the machines' CPUs can serve (``engine_limit``)."""

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise numpy integers and the like to int
        set_(self, "n", whole(self.n, "the number of engines", 1))
        if (threads := self.threads_per_engine) is not None:
            set_(self, "threads_per_engine", whole(threads, "threads_per_engine (--threads)", 1))
        set_(self, "heartbeat_ms", whole(self.heartbeat_ms, "heartbeat_ms", 10, 60_000))
        set_(self, "heartbeat_misses", whole(self.heartbeat_misses, "heartbeat_misses", 1))
        set_(self, "start_timeout", seconds(self.start_timeout, "start_timeout"))
        set_(self, "group_timeout", seconds(self.group_timeout, "group_timeout"))
        if self.backend not in (None, "gloo", "nccl"):
            raise UsageError(f"backend must be 'gloo' or 'nccl', not {self.backend!r}")
        _flag(self.allow_mixed, "allow_mixed")
        _flag(self.oversubscribe, "oversubscribe")
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
    def threads(self) -> int:
        """Threads each engine uses: the given number, or a fair share of this machine's CPUs."""
        return self.threads_per_engine or max(1, cpu_count() // self.n)


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
    profile: int | bool = False
    """torch.profiler on every rank: True for the whole cell, N for its first N steps."""
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise what the Python API may pass
        if self.timeout is not None:
            fix = " (leave --timeout out for none)"
            set_(self, "timeout", seconds(self.timeout, "--timeout", fix=fix))
        if self.ranks is not None:
            set_(self, "ranks", _rank_list(self.ranks))
        _flag(self.all_output, "all_output")
        _flag(self.quiet, "quiet")
        set_(self, "grace", seconds(self.grace, "grace", zero=True))
        set_(self, "stop_wait", seconds(self.stop_wait, "stop_wait", zero=True))
        set_(self, "restarts", whole(self.restarts, "--restarts", 0, MAX_RESTARTS))
        if self.min_workers is not None:
            set_(self, "min_workers", whole(self.min_workers, "--min-workers", 1))
            if not self.restarts:
                raise UsageError(
                    "--min-workers only acts when a lost worker is not replaced: add --restarts R"
                )
        low, fix = MIN_PROGRESS_TIMEOUT, " (reports come every 0.2 s)"
        set_(
            self, "progress_timeout", seconds(self.progress_timeout, "--progress-timeout", low, fix)
        )
        if not isinstance(self.profile, bool):  # True: the whole cell; N: its first N steps
            set_(self, "profile", whole(self.profile, "--profile STEPS", 1))
        if not isinstance(self.extra, dict):
            raise UsageError(f"extra must be a dict, not {type(self.extra).__name__}")


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
        for name in ("ui_interval", "store_interval", "silent_after"):
            seconds(getattr(self, name), name)
        if not (isinstance(self.slow_factor, (int, float)) and 1 < self.slow_factor < math.inf):
            raise UsageError(f"slow_factor must be a number > 1, not {self.slow_factor!r}")
        whole(self.log_lines, "log_lines", 0)


#: Plausible host names, addresses and interface names, and user names: none starts with "-"
#: (ssh would take it for an option), none holds a space, a quote or a shell metacharacter.
_HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:%-]{0,252}\Z")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\Z")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _control(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


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
        # Names reach ssh's command line: one starting with "-" would be read as an option.
        if not isinstance(self.name, str) or not _HOST_NAME.match(self.name):
            raise UsageError(
                f"{self.name!r} is not a host name (letters, digits and . - _ :, not starting "
                "with -): write hosts as user@host:engines"
            )
        set_ = object.__setattr__
        set_(self, "engines", whole(self.engines, f"host {self.name}: engines", 1))
        if self.user is not None and not (isinstance(self.user, str) and _USER.match(self.user)):
            raise UsageError(
                f"host {self.name}: {self.user!r} is not a user name (letters, digits and . - _, "
                "not starting with -)"
            )
        port = self.port
        if port is not None and (type(port) is not int or not 0 < port < 65536):
            raise UsageError(f"host {self.name}: port must be between 1 and 65535, not {port!r}")
        if not isinstance(self.python, str) or not self.python.strip() or _control(self.python):
            raise UsageError(f"host {self.name}: name the Python to run there (python = ...)")
        for key in ("interface", "address"):
            value = getattr(self, key)
            if value is not None and not (isinstance(value, str) and _HOST_NAME.match(value)):
                raise UsageError(f"host {self.name}: {value!r} is not a valid {key}")
        opts = self.ssh_options
        if not isinstance(opts, (tuple, list)) or not all(isinstance(o, str) for o in opts):
            raise UsageError(
                f'host {self.name}: ssh_options must be a list of strings, like ["-i", "key"]'
            )
        set_(self, "ssh_options", tuple(opts))
        env = self.environment
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and _ENV_NAME.match(k) and isinstance(v, str) for k, v in env.items()
        ):
            raise UsageError(
                f'host {self.name}: environment must be a table of NAME = "value" (NAME: '
                "letters, digits and _)"
            )

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
    partition: str | None = None
    """Slurm: the partition (--partition); default: the cluster's default partition."""
    time: str | None = None
    """Slurm: the job's time limit (--time), e.g. "30" (minutes) or "1:30:00"."""
    gpus_per_node: int | None = None
    """Slurm: GPUs per node (--gpus-per-node), through the scheduler (--gres/--gpus)."""
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
        rc = self  # the launcher, its hosts and options, the scheduler's words: checked there
        time = launcher_config.check(
            rc.launcher, rc.hosts, rc.launcher_options, rc.partition, rc.time, rc.gpus_per_node
        )
        object.__setattr__(self, "time", time)  # as Slurm's text
        if not isinstance(self.hosts, (tuple, list)) or not all(
            isinstance(h, HostSpec) for h in self.hosts
        ):
            raise UsageError("hosts must be HostSpecs: write them as user@gpu1:4,user@gpu2:4")
        object.__setattr__(self, "hosts", tuple(self.hosts))
        if self.ip is not None and self.launcher == "local":
            check_local_ip(self.ip)  # ipyparallel's local launcher: engines on this machine
        elif self.ip is not None and not (isinstance(self.ip, str) and _HOST_NAME.match(self.ip)):
            if self.ip != "*":
                raise UsageError(f"--ip {self.ip!r} is not an address of this machine")
        if not isinstance(self.env_check, str) or self.env_check not in ("refuse", "warn"):
            raise UsageError(f"env_check must be 'refuse' or 'warn', not {self.env_check!r}")
        timeout = seconds(self.connect_timeout, "connect_timeout")
        object.__setattr__(self, "connect_timeout", timeout)
        rd = self.remote_dir
        if not isinstance(rd, str) or not rd or ".." in rd.split("/") or _control(rd):
            raise UsageError(f"remote_dir {rd!r}: name a directory without '..'")
