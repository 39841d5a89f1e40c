"""ipyparallel's engine launchers as nbdist uses them: ``ssh`` (leaner, and concurrent),
``slurm``, ``mpi`` and ``local`` (ipyparallel's own), with their options passed through.

The SSH launcher subclasses override members of ipyparallel's (``_start_waiting``,
``_ssh_sender``): they are tied to the ipyparallel versions nbdist is tested with.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import threading
import time
from collections.abc import Callable

from ipyparallel.cluster import launcher as ipp_launcher
from ipyparallel.cluster.shellcmd import ShellCommandSend
from traitlets import Integer

from .....config import RemoteConfig
from .....errors import UsageError
from .....records import slurm
from .....remote_config import check_launcher_option

#: Engines of remote hosts: quiet logs, no IPython history database, and gone ~10 s after the
#: controller is (the kernel died, or this machine went away): 7 checks missed, each the
#: controller's heartbeat period (1 s, ``ClusterConfig.heartbeat_ms``) + 0.5 s.
ENGINE_ARGS = [
    "--log-level=WARN",
    "--HistoryManager.enabled=False",
    "--IPEngine.max_heartbeat_misses=7",
]


class Cancelled(Exception):
    """The engine set was stopped before this engine started."""


class SSHEngineLauncher(ipp_launcher.SSHEngineLauncher):
    """ipyparallel's SSH engine launcher (its shell detection, its remote starter, its kill),
    leaner. The checks run once per host, not per engine: no ``python --version`` or
    ``ipython profile create`` (the preflight checked the Python; a mkdir makes the folder).
    The engines of a host start at once, each in a thread. No ssh session per engine polls it
    (the controller reports deaths: the nanny within milliseconds, heartbeats for a lost
    host), and no output is copied back at exit."""

    def _start_waiting(self):
        pass

    def get_output(self, remove=False):
        return ""

    @property
    def ssh_sender(self):
        if self._ssh_sender is None:  # the starter's code goes along: no ipyparallel import
            # ipyparallel puts the Python into the remote command line as it is: quoted here,
            # so a path with spaces or shell characters is one word there ("--": no host name
            # is ever read as an ssh option)
            self._ssh_sender = ShellCommandSend(
                self.ssh_cmd,
                [*self.ssh_args, "--", self.location],
                shlex.quote(self.remote_python),
                send_receiver_code=True,
                log=self.log,
            )
        return self._ssh_sender

    def start(self, hostname=None, user=None, port=None):
        engine_set = self.parent
        if engine_set.cancelled:
            raise Cancelled()
        self.hostname, self.user = hostname or self.hostname, user or self.user
        first = engine_set.first_on.get(self.location)
        if first is None:
            engine_set.first_on[self.location] = self
            log_dir = os.path.dirname(self.remote_output_file)
            self.ssh_sender.check_output(f"umask 077 && mkdir -p -- {shlex.quote(log_dir)}")
        else:
            self._ssh_sender = first.ssh_sender  # its shell is known, its folder made
        engine_set.spawn(self._start_engine)

    def _start_engine(self) -> None:
        pid = self.ssh_sender.cmd_start(
            self.program + self.program_args,
            env=self.get_env(),
            output_file=self.remote_output_file,
        )
        self.pid = pid
        self.notify_start({"host": self.location, "pid": pid})


class SSHEngineSetLauncher(ipp_launcher.SSHEngineSetLauncher):
    """ipyparallel's SSH engine-set launcher, started in a thread of its own (and each engine
    in one more), so that hosts and engines start at the same time. ``error`` holds what
    stopped it; ``wait()`` stops it and joins its threads."""

    launcher_class = SSHEngineLauncher

    def start(self, n):
        self.error: BaseException | None = None
        self.cancelled = False
        self.first_on: dict[str, SSHEngineLauncher] = {}
        self._threads: list[threading.Thread] = []
        self.spawn(lambda: ipp_launcher.SSHEngineSetLauncher.start(self, n))
        return []

    def spawn(self, target: Callable[[], object]) -> None:
        """Run ``target`` in a thread; keep its error for the engine set to raise."""

        def run():
            try:
                target()
            except BaseException as exc:
                self.error = self.error or exc

        t = threading.Thread(target=run, name="nbdist-ssh-launch", daemon=True)
        self._threads.append(t)
        t.start()

    def wait(self, timeout: float) -> None:
        """Start no more engines; wait for those being started (ssh calls) to be done."""
        self.cancelled = True
        deadline = time.monotonic() + timeout
        i = 0
        while i < len(self._threads):  # the list grows while the first thread runs
            self._threads[i].join(max(0.0, deadline - time.monotonic()))
            i += 1

    def engine_pids(self) -> list[int]:
        """The pids (on the host) of the engines started so far."""
        return [la.pid for la in self.launchers.values() if getattr(la, "pid", 0)]


class SlurmEngineSetLauncher(ipp_launcher.SlurmEngineSetLauncher):
    """ipyparallel's Slurm engine launcher, with GPUs per node (``--gpus-per-node``) and its
    ``options`` (extra ``sbatch`` options, which ipyparallel declares but never writes) put
    into the batch script."""

    gpus_per_node = Integer(0, config=True, help="GPUs per node (sbatch --gpus-per-node)")

    def _insert_options_in_script(self):
        super()._insert_options_in_script()
        extra = []
        if self.gpus_per_node:
            extra.append(f"#SBATCH --gpus-per-node={self.gpus_per_node}")
        extra += [f"#SBATCH {shlex.join(option)}" for option in slurm.grouped(self.options)]
        if extra:
            first, rest = self.batch_template.split("\n", 1)
            self.batch_template = "\n".join([first, *extra, rest])


class MPIEngineSetLauncher(ipp_launcher.MPIEngineSetLauncher):
    """ipyparallel's mpiexec launcher, without ``ipengine --mpi``: the ranks talk over
    torch.distributed, so the engines need no mpi4py (which ``--mpi`` imports)."""

    @property
    def program(self):
        return self.engine_cmd


#: The engine-set launcher for each ``--launcher`` name.
LAUNCHER_CLASSES: dict[str, type[ipp_launcher.BaseLauncher]] = {
    "ssh": SSHEngineSetLauncher,
    "slurm": SlurmEngineSetLauncher,
    "mpi": MPIEngineSetLauncher,
    "local": ipp_launcher.LocalEngineSetLauncher,
}


def scheduler_options(rc: RemoteConfig) -> dict:
    """The scheduler's words of ``rc`` (``--partition``, ``--time``, ``--gpus-per-node``) as
    options of ipyparallel's Slurm launcher."""
    named = {"queue": rc.partition, "timelimit": rc.time, "gpus_per_node": rc.gpus_per_node}
    return {k: v for k, v in named.items() if v is not None}


def launcher_options(kind: str, options: dict) -> dict:
    """``options`` checked against the options of ipyparallel's ``kind`` engine launcher, and
    strings (from ``--launcher-opt KEY=VALUE``) converted to the option's type; a value that
    holds a control character once converted is refused (it would start a line of a batch
    script, or a command)."""
    cls = LAUNCHER_CLASSES[kind]
    traits = cls.class_traits(config=True)
    out = {}
    for key, value in options.items():
        if key not in traits:
            raise UsageError(
                f"the {kind} launcher has no option {key!r}; its options: "
                f"{', '.join(sorted(traits))}"
            )
        if isinstance(value, str):
            try:
                value = traits[key].from_string(value)
            except Exception as exc:
                raise UsageError(f"launcher option {key}={value!r}: {exc}") from None
        check_launcher_option(key, value)  # as the launcher will write it: still one line
        out[key] = value
    return out


def has_batch_file(kind: str) -> bool:
    """Whether ``kind``'s launcher writes a batch script (then it goes with the logs)."""
    return "batch_file_name" in LAUNCHER_CLASSES[kind].class_traits()


def local_roots(engine_set: ipp_launcher.BaseLauncher) -> list[int]:
    """The pids of the processes an engine-set launcher runs on this machine (local engines,
    mpiexec, a batch command); none for SSH engines, which run on their hosts."""
    roots = []
    for launcher in [engine_set, *getattr(engine_set, "launchers", {}).values()]:
        proc = getattr(launcher, "process", None)
        if proc is not None and not isinstance(launcher, SSHEngineLauncher):
            roots.append(proc.pid)
    return roots


def why(exc: BaseException) -> str:
    """What a launcher's failure says: a failed command's status and output, or the error."""
    if isinstance(exc, subprocess.CalledProcessError):
        return f"{exc.cmd[0]} exited with status {exc.returncode}: {exc.output or ''}"
    return str(exc) or type(exc).__name__
