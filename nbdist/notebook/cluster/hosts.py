"""Where remote engines run: ``--hosts`` strings and cluster files, read into a ClusterConfig.

Pure: nothing here connects anywhere, so every mistake is found (and named, with its fix) before
a process starts. Also here: the words for what ssh says when it cannot reach a host.

A cluster file (TOML; YAML too where PyYAML is installed) holds what ``--hosts`` cannot say::

    launcher = "ssh"                          # ssh | slurm | mpi | local
    ip = "10.0.0.5"                           # the controller's address (default: chosen)
    python = "/opt/envs/train/bin/python"     # default for every host
    interface = "eth1"                        # default for every host
    ssh_options = ["-i", "~/.ssh/id_gpu"]     # default for every host
    env_check = "refuse"                      # or "warn"
    allow_mixed = false                       # ranks without a GPU beside ranks with one
    oversubscribe = false                     # more than 4 engines per CPU of a host
    pin_cores = true                          # each CPU rank on its own share of its cores
    shared_memory = true                      # DDP on CPU all-reduces through shared memory
    partition = "gpu"                         # slurm: --partition, --time, --gpus-per-node
    time = "1:00:00"
    gpus_per_node = 4

    [[hosts]]
    host = "gpu1"
    user = "alice"
    engines = 4
    port = 22
    interface = "ib0"
    environment = { NCCL_DEBUG = "WARN" }

    [launcher_options]                        # ipyparallel's launcher options (slurm, mpi)
    account = "ml"

Keyword arguments given to ``nbdist.start`` (or options of ``%nbdist start``) win over the file.
Host and user names are refused unless plausible (never starting with ``-``, no spaces, quotes
or shell characters): they reach ssh's command line. A cluster file is code all the same: its
``python``, ``ssh_options`` and launcher options name commands that run.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

from ... import paths
from ...config import ClusterConfig, HostSpec, RemoteConfig
from ...errors import UsageError

#: Keys a cluster file's top level may hold (besides ``hosts`` and ``launcher_options``).
FILE_KEYS = {
    "launcher",
    "ip",
    "python",
    "interface",
    "ssh_options",
    "env_check",
    "allow_mixed",
    "connect_timeout",
    "remote_dir",
    "n",
    "engines",
    "threads_per_engine",
    "backend",
    "start_timeout",
    "group_timeout",
    "heartbeat_ms",
    "hosts",
    "launcher_options",
    "oversubscribe",
    "pin_cores",
    "shared_memory",
    "partition",
    "time",
    "gpus_per_node",
}
_HOST_KEYS = {f.name for f in dataclasses.fields(HostSpec)} | {"host"}
_HOST_DEFAULTS = ("python", "interface", "ssh_options")  # top-level defaults for every host
_REMOTE_KEYS = {f.name for f in dataclasses.fields(RemoteConfig)} - {"hosts"}
_CLUSTER_KEYS = {f.name for f in dataclasses.fields(ClusterConfig)} - {"n", "remote", "ip"}
#: Options of ``nbdist.start`` that make a cluster remote.
REMOTE_OPTIONS = frozenset({"hosts", "launcher", "cluster_file"})

_ITEM = re.compile(r"^(?:(?P<user>[^@:\s]+)@)?(?P<host>[^@:\s]+)(?::(?P<n>[^:\s]*))?$")


def parse_hosts(text: str, **defaults) -> tuple[HostSpec, ...]:
    """``"user@gpu1:4,user@gpu2:4"`` → one HostSpec per host (4 engines each; ``:N`` defaults
    to 1). ``defaults`` (python, interface, ssh_options, ...) apply to every host."""
    specs = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            raise UsageError(f"--hosts {text!r} has an empty entry: write user@gpu1:4,user@gpu2:4")
        m = _ITEM.match(item)
        if m is None or item.startswith("["):
            raise UsageError(
                f"--hosts entry {item!r} is not user@host:engines (IPv6 addresses and ports: "
                "give them a name in ~/.ssh/config, or use a cluster file)"
            )
        n = m["n"]
        if n is not None and not (
            re.fullmatch(r"[0-9]{1,6}", n) and int(n) >= 1
        ):  # not '²'.isdigit()
            raise UsageError(f"--hosts entry {item!r}: engines after ':' must be a number >= 1")
        specs.append(
            _host(dict(defaults, name=m["host"], user=m["user"], engines=int(n or 1)), item)
        )
    _no_duplicates(specs)
    return tuple(specs)


def _host(values: dict, where: str) -> HostSpec:
    values = dict(values)
    if "host" in values:
        values["name"] = values.pop("host")
    unknown = set(values) - _HOST_KEYS
    if unknown:
        raise UsageError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))}; a host takes "
            f"{', '.join(sorted(_HOST_KEYS - {'name'}))}"
        )
    if "name" not in values:
        raise UsageError(f'{where}: every [[hosts]] entry needs host = "name"')
    opts = values.get("ssh_options", ())
    if isinstance(opts, str):
        try:
            opts = shlex.split(opts)
        except ValueError as exc:  # unbalanced quotes
            raise UsageError(f"{where}: ssh_options: {exc}") from None
    if not isinstance(opts, (list, tuple)) or not all(isinstance(o, str) for o in opts):
        raise UsageError(f'{where}: ssh_options must be a list of strings, like ["-i", "key"]')
    values["ssh_options"] = tuple(opts)
    env = values.get("environment") or {}
    if not isinstance(env, dict):
        raise UsageError(f'{where}: environment must be a table of NAME = "value"')
    values["environment"] = {str(k): str(v) for k, v in env.items()}
    try:
        return HostSpec(**values)
    except TypeError as exc:  # a value of the wrong kind
        raise UsageError(f"{where}: {exc}") from None


def _no_duplicates(specs: list[HostSpec]) -> None:
    seen = set()
    for s in specs:
        if s.name in seen:
            raise UsageError(
                f"host {s.name} is named twice: give it once, with all its engines ({s.name}:N)"
            )
        seen.add(s.name)


def read_cluster_file(path: str | Path) -> dict:
    """The options in a cluster file (TOML, or YAML where PyYAML is installed), checked."""
    p = paths.expand(path, "the cluster file")
    if not p.is_file():
        raise UsageError(f"no cluster file at {p}: check the path (or use --hosts)")
    text = p.read_text()
    if p.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise UsageError(f"{p} is YAML but PyYAML is not installed: use TOML") from None
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise UsageError(f"cluster file {p} is not valid YAML: {_first_line(exc)}") from None
    else:
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"cluster file {p} is not valid TOML: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"cluster file {p} must be a table of settings")
    unknown = set(data) - FILE_KEYS
    if unknown:
        raise UsageError(
            f"cluster file {p}: unknown key(s) {', '.join(sorted(unknown))}; "
            f"it takes {', '.join(sorted(FILE_KEYS))}"
        )
    hosts = data.get("hosts", [])
    if not isinstance(hosts, list) or not all(isinstance(h, dict) for h in hosts):
        raise UsageError(f"cluster file {p}: hosts must be a list of [[hosts]] tables")
    if not isinstance(data.get("launcher_options", {}), dict):
        raise UsageError(f"cluster file {p}: launcher_options must be a table")
    return data


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def cluster_config(n: int | None = None, **options) -> ClusterConfig:
    """The ClusterConfig that ``nbdist.start``'s options describe (None values: not given).

    Local engines (``n``, default 2) unless one of ``hosts`` (a string or HostSpecs),
    ``cluster_file`` or ``launcher`` is given; then also ``ip``, ``launcher_options``,
    per-host defaults (``python``, ``interface``, ``ssh_options``) and any RemoteConfig field.
    Explicit options win over the cluster file."""
    given = {k: v for k, v in options.items() if v is not None}
    if not REMOTE_OPTIONS & given.keys():
        unknown = set(given) - {f.name for f in dataclasses.fields(ClusterConfig)}
        remote_only = unknown & (_REMOTE_KEYS | set(_HOST_DEFAULTS))
        if remote_only:
            raise UsageError(
                f"{', '.join(sorted(remote_only))}: for engines on other hosts; name them with "
                "--hosts, --cluster-file or --launcher"
            )
        if unknown:
            raise UsageError(f"unknown option(s) {', '.join(sorted(unknown))} for nbdist.start")
        return ClusterConfig(n=2 if n is None else n, **given)
    options = given
    merged: dict = {}
    if not isinstance(options.get("cluster_file", ""), (str, Path)):
        raise UsageError(f"cluster_file must be a path, not {options['cluster_file']!r}")
    if options.get("cluster_file"):
        merged.update(read_cluster_file(options["cluster_file"]))
        file_hosts = merged.pop("hosts", [])
        where = f"cluster file {options['cluster_file']}"
    else:
        file_hosts, where = [], "hosts"
    merged.update({k: v for k, v in options.items() if v is not None and k != "cluster_file"})
    if "n" in merged:
        n = n if n is not None else merged.pop("n")
    merged.pop("n", None)
    engines = merged.pop("engines", None)
    if n is None:
        n = engines
    unknown = set(merged) - _REMOTE_KEYS - _CLUSTER_KEYS - set(_HOST_DEFAULTS) - {"hosts", "ip"}
    if unknown:
        raise UsageError(f"unknown option(s) {', '.join(sorted(unknown))} for a remote cluster")
    defaults = {k: merged.pop(k) for k in _HOST_DEFAULTS if k in merged}
    hosts = merged.pop("hosts", None)
    if not isinstance(hosts, (str, list, tuple, type(None))) or not all(
        isinstance(h, (HostSpec, dict)) for h in ([] if isinstance(hosts, str) else hosts or [])
    ):
        raise UsageError(f"hosts must be a string like user@gpu1:4,user@gpu2:4, not {hosts!r}")
    if isinstance(hosts, str):
        specs = parse_hosts(hosts, **defaults)
    elif hosts:
        specs = tuple(
            h if isinstance(h, HostSpec) else _host({**defaults, **h}, where) for h in hosts
        )
    else:
        specs = tuple(
            _host({**defaults, **h}, f"{where}, host {i + 1}") for i, h in enumerate(file_hosts)
        )
    _no_duplicates(list(specs))
    launcher = merged.pop("launcher", None) or ("ssh" if specs else "local")
    remote = RemoteConfig(
        launcher=launcher,
        hosts=specs,
        **{k: merged.pop(k) for k in list(merged) if k in _REMOTE_KEYS},
    )
    if specs:
        total = sum(h.engines for h in specs)
        if n is not None and n != total:
            raise UsageError(
                f"-n {n} but the hosts have {total} engines in all: drop -n, or change the hosts"
            )
        n = total
    if n is None:
        n = 2
    if launcher == "ssh" and not specs:
        raise UsageError("the ssh launcher needs hosts: --hosts user@gpu1:4,user@gpu2:4")
    return ClusterConfig(n=n, remote=remote, **merged)


def ssh_command(host: HostSpec, connect_timeout: float) -> list[str]:
    """The ssh command that reaches ``host`` without ever prompting (a prompt would hang)."""
    cmd = [
        "ssh",
        "-o",
        "BatchMode=yes",  # no password or passphrase prompt: fail instead
        "-o",
        f"ConnectTimeout={max(1, round(connect_timeout))}",  # TCP and the SSH banner
        "-o",
        "ServerAliveInterval=5",
        "-o",
        "ServerAliveCountMax=3",  # a host that goes silent: the connection ends in 15 s
        *host.ssh_options,
    ]
    if host.port is not None:
        cmd += ["-p", str(host.port)]
    return cmd


def ssh_failure(host: HostSpec, returncode: int, stderr: str, connect_timeout: float) -> str:
    """One line naming ``host``, what went wrong when ssh ran there, and the fix."""
    err = " ".join(stderr.split())
    loc = host.location
    if returncode == 255:  # ssh's own failure: the host was not reached or refused the login
        if "Could not resolve hostname" in err or "Name or service not known" in err:
            return (
                f"host {host.name}: no such host name: check the spelling, or give its address "
                "(or an alias in ~/.ssh/config)"
            )
        if "timed out" in err:
            return (
                f"host {host.name} did not answer within {connect_timeout:g} s: check that it is "
                "up and that this machine can reach it (try: ssh " + loc + ")"
            )
        if "Connection refused" in err:
            port = f" on port {host.port}" if host.port else ""
            return (
                f"host {host.name} refused the connection{port}: is sshd running there, on "
                "that port?"
            )
        if "No route to host" in err or "Network is unreachable" in err:
            return (
                f"host {host.name} cannot be reached from this machine (no route): check the "
                "network, or the address"
            )
        if "Host key verification failed" in err or "REMOTE HOST IDENTIFICATION" in err:
            return (
                f"host {host.name}: its SSH host key is not known here (or has changed): run "
                f"ssh {loc} once to check and accept it"
            )
        if "Permission denied" in err or "Too many authentication failures" in err:
            who = f"user {host.user}" if host.user else "your user name"
            return (
                f"host {host.name} refused the login as {who} ({_tail(err)}): check the user "
                f"name, and that your key is authorized there (ssh-copy-id {loc})"
            )
        return f"host {host.name}: ssh failed ({_tail(err) or 'exit 255'}): try ssh {loc}"
    if returncode == 127 or "not found" in err or "No such file" in err:
        return (
            f"host {host.name}: no Python at {host.python!r}: name the Python that has nbdist "
            'installed there (python = "/path/to/python" in the cluster file)'
        )
    return f"host {host.name}: {host.python} failed ({_tail(err) or f'exit {returncode}'})"


def missing_modules(host: HostSpec, missing: list[str], executable: str) -> str:
    """One line for a host whose Python lacks what engines need, with the fix."""
    return (
        f"host {host.name}: the Python there ({executable}) lacks {', '.join(missing)}: "
        f"install {'them' if len(missing) > 1 else 'it'} in that environment "
        f"(pip install {' '.join(missing)}), or name another Python for the host"
    )


def _tail(err: str, limit: int = 120) -> str:
    return err if len(err) <= limit else "..." + err[-limit:]


def remote_dir_of(cfg: RemoteConfig, cluster_id: str) -> str:
    """The folder on each host for one cluster's engine logs (relative to the home)."""
    return f"{cfg.remote_dir.rstrip('/')}/{cluster_id}"
