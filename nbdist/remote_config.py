"""Where remote engines run: ``HostSpec`` (one SSH host) and ``RemoteConfig`` (the launcher, its
hosts and the scheduler's words), validated when built. ``config.ClusterConfig.remote`` holds one.

Pure: nothing here runs a command. The scheduler's words are nbdist's (``partition``, ``time``,
``gpus_per_node``: Slurm's ``--partition``, ``--time`` and ``--gpus-per-node``); what only the
scheduler can judge (a partition that does not exist, GPUs on a cluster without them) is asked of
it before submitting (``records.slurm.precheck``).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from .errors import UsageError
from .validate import check_local_ip, seconds, whole

LAUNCHERS = ("ssh", "slurm", "mpi", "local")
#: Slurm's time formats: MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS,
#: DAYS-HOURS:MINUTES, DAYS-HOURS:MINUTES:SECONDS; or UNLIMITED.
_TIME = re.compile(r"(\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|unlimited|infinite)\Z", re.I)
_PARTITION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}(,[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})*\Z")
TIME_FORMATS = "MINUTES, HH:MM:SS or DAYS-HH[:MM[:SS]] (e.g. 30, 1:30:00, 2-00)"


def _check_launcher(
    launcher: Any,
    hosts: Any,
    launcher_options: Any,
    partition: Any,
    time: Any,
    gpus_per_node: Any,
) -> str | None:
    """Refuse, in one line with the fix, a launcher setting that cannot work; return ``time``
    as Slurm's text (minutes given as a number normalised), or None when not given."""
    if not isinstance(launcher, str) or launcher not in LAUNCHERS:
        raise UsageError(f"--launcher must be one of {', '.join(LAUNCHERS)}, not {launcher!r}")
    if launcher == "ssh" and not hosts:
        raise UsageError("the ssh launcher needs hosts: --hosts user@gpu1:4,user@gpu2:4")
    if launcher != "ssh" and hosts:
        raise UsageError(f"hosts are for the ssh launcher; {launcher} finds its own")
    if not isinstance(launcher_options, dict):
        raise UsageError("launcher options must be a table of KEY = value")
    for key, value in launcher_options.items():
        check_launcher_option(key, value)
    scheduler = {"partition": partition, "time": time, "gpus_per_node": gpus_per_node}
    given = [name for name, value in scheduler.items() if value is not None]
    if given and launcher != "slurm":
        flags = ", ".join("--" + g.replace("_", "-") for g in given)
        raise UsageError(
            f"{flags}: for the slurm launcher, not {launcher} (add --launcher slurm, or drop them)"
        )
    if partition is not None and not (isinstance(partition, str) and _PARTITION.match(partition)):
        raise UsageError(
            f"--partition {partition!r} is not a partition name (see sinfo -s for the names)"
        )
    text = None if time is None else slurm_time(time)
    g = gpus_per_node
    if g is not None and (type(g) is not int or g < 1):
        raise UsageError(f"--gpus-per-node must be a whole number >= 1, not {g!r}")
    return text


def slurm_time(value: object) -> str:
    """``value`` (Slurm's time text, or whole minutes) as Slurm's time text; else one line."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return str(value)
    if isinstance(value, str) and _TIME.match(value.strip()) and value.strip() not in ("0",):
        return value.strip()
    raise UsageError(f"--time {value!r} is not a Slurm time limit: write {TIME_FORMATS}")


#: Plausible host names, addresses and interface names, and user names: none starts with "-"
#: (ssh would take it for an option), none holds a space, a quote or a shell metacharacter.
_HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:%-]{0,252}\Z")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\Z")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _control(text: str) -> bool:
    """Whether ``text`` holds a control character or a line break of any kind (a newline, a
    carriage return, NUL, an escape, U+2028...): written into a batch script or a command line,
    one would start a line, or a command, of its own."""
    return any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in text)


def check_text(value: Any, what: str) -> None:
    """Refuse, in one line naming ``what``, a control character anywhere in ``value`` (a
    string, or the strings in a list or table of them): every such value reaches a batch
    script or a command line."""
    if isinstance(value, str):
        if _control(value):
            raise UsageError(
                f"{what} {value!r:.80} holds a control character (a newline, a tab...): "
                "write it on one line, without them"
            )
    elif isinstance(value, dict):
        for k, v in value.items():
            check_text(k, f"{what}: the key")
            check_text(v, f"{what}: {k}" if isinstance(k, str) else what)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for v in value:
            check_text(v, what)


#: Launcher options that are scripts themselves: lines are what they are made of.
MULTILINE_OPTIONS = frozenset({"batch_template"})


def check_launcher_option(key: Any, value: Any) -> None:
    """One launcher option, as given or as converted for the launcher: a name, and a value
    with no control character (a newline would become a line of the batch script); only a
    whole batch template may hold lines (and tabs)."""
    if not isinstance(key, str) or not key.isidentifier():
        raise UsageError(f"launcher option {key!r:.80}: option names are words, like account")
    if key in MULTILINE_OPTIONS and isinstance(value, str):
        check_text(value.replace("\n", "").replace("\t", ""), f"launcher option {key}")
    else:
        check_text(value, f"launcher option {key}")


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
        check_text(opts, f"host {self.name}: ssh option")
        set_(self, "ssh_options", tuple(opts))
        env = self.environment
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and _ENV_NAME.match(k) and isinstance(v, str) for k, v in env.items()
        ):
            raise UsageError(
                f'host {self.name}: environment must be a table of NAME = "value" (NAME: '
                "letters, digits and _)"
            )
        check_text(env, f"host {self.name}: environment")

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
        time = _check_launcher(
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
