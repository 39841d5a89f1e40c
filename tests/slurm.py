"""A private single-node Slurm for the tests: munged, slurmctld and slurmd, all children of the
caller, tracked by PID, with their key, sockets, config, state and spool in one temp folder.

``Slurm(home)`` starts the three daemons (munged with its own key and socket; ``slurm.conf``
with ``ProctrackType=proctrack/linuxproc`` and ``TaskPlugin=task/none``, free ports, and
``SlurmdParameters=config_overrides`` so that this node offers 8 CPUs whatever it has) and waits,
with a deadline, until ``scontrol ping`` answers and ``sinfo`` shows the node idle. Two
partitions: ``debug`` (the default) and ``held`` (down: jobs sent there stay queued, with the
reason ``PartitionDown``). ``env`` is what a client needs (``SLURM_CONF``); ``activate()`` puts
it into ``os.environ`` (kernels started later inherit it). ``jobs()`` lists the queue.
``stop()`` cancels every job, waits for the queue and the job steps to be gone, then stops the
daemons by PID (TERM, then KILL after a deadline).

``unavailable()`` gives the reason this cannot run here (not root, Slurm or munge missing), or
None. Needs neither pytest nor conftest.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
MUNGED = "/usr/sbin/munged"
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "srun")


def _poll(predicate, timeout: float, what: str, interval: float = 0.05):
    """Poll ``predicate`` until truthy; raise naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
    return value


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unavailable() -> str | None:
    """Why a private Slurm cannot be started here, or None."""
    if os.geteuid() != 0:
        return "a private Slurm needs root here (slurmd runs jobs as their users)"
    missing = [p for p in (MUNGED, SLURMCTLD, SLURMD) if not os.access(p, os.X_OK)]
    missing += [c for c in CLIENTS if shutil.which(c) is None]
    if missing:
        return (
            f"Slurm is not installed ({', '.join(missing)} missing): run "
            "scripts/install-system-deps.sh (slurm-wlm, munge)"
        )
    return None


class Slurm:
    """munged, slurmctld and slurmd for one node, in ``home``; ``stop()`` ends them."""

    def __init__(self, home: Path, timeout: float = 30.0):
        self.home = home
        self.node = socket.gethostname()
        self.procs: dict[str, subprocess.Popen] = {}
        for d in ("munge", "state", "spool", "log"):
            (home / d).mkdir(mode=0o700, exist_ok=True)
        self.socket = home / "munge" / "munge.socket"
        self.conf = home / "slurm.conf"
        self.env = {"SLURM_CONF": str(self.conf)}
        try:
            self._munged(timeout)
            self._write_conf()
            env = {**os.environ, **self.env}
            self._spawn("slurmctld", [SLURMCTLD, "-D", "-c", "-f", str(self.conf)], env)
            _poll(self._ping, timeout, "slurmctld to answer (scontrol ping)", 0.1)
            self._spawn("slurmd", [SLURMD, "-D", "-f", str(self.conf), "-N", self.node], env)
            _poll(self._idle, timeout, "the node to be idle (sinfo)", 0.1)
        except BaseException as exc:
            logs = self.logs()
            self.stop()
            raise RuntimeError(f"the private Slurm did not start: {exc}\n{logs}") from exc

    # -- start ------------------------------------------------------------------------------
    def _spawn(self, name: str, cmd: list[str], env: dict | None = None) -> None:
        out = open(self.home / "log" / f"{name}.out", "wb")  # noqa: SIM115 (closed by the child)
        try:
            self.procs[name] = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        finally:
            out.close()

    def _munged(self, timeout: float) -> None:
        key = self.home / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        m = self.home / "munge"
        cmd = [MUNGED, "-F", "--force", f"--socket={self.socket}", f"--key-file={key}"]
        cmd += [f"--pid-file={m / 'munged.pid'}", f"--seed-file={m / 'munged.seed'}"]
        cmd += [f"--log-file={self.home / 'log' / 'munged.log'}"]
        self._spawn("munged", cmd)
        _poll(self.socket.exists, timeout, "munged's socket")

    def _write_conf(self) -> None:
        h, n = self.home, self.node
        self.ctld_port, self.slurmd_port = _free_port(), _free_port()
        lines = [
            "ClusterName=nbdisttest",
            f"SlurmctldHost={n}(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={h / 'state'}",
            f"SlurmdSpoolDir={h / 'spool'}",
            f"SlurmctldPidFile={h / 'state' / 'slurmctld.pid'}",
            f"SlurmdPidFile={h / 'spool' / 'slurmd.pid'}",
            f"SlurmctldLogFile={h / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={h / 'log' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "MinJobAge=300",
            "DefMemPerCPU=100",
            "KillWait=2",
            "MessageTimeout=5",
            "SlurmctldTimeout=10",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "MpiDefault=none",
            f"NodeName={n} NodeAddr=127.0.0.1 CPUs=8 RealMemory=1000 State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            "PartitionName=held Nodes=ALL MaxTime=INFINITE State=DOWN",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def _run(self, *cmd: str, timeout: float = 10.0) -> subprocess.CompletedProcess:
        return subprocess.run(
            cmd, capture_output=True, text=True, env={**os.environ, **self.env}, timeout=timeout
        )

    def _ping(self) -> bool:
        self._check_alive()
        return "is UP" in self._run("scontrol", "ping").stdout

    def _idle(self) -> bool:
        self._check_alive()
        state = self._run("sinfo", "-h", "-n", self.node, "-p", "debug", "-o", "%t").stdout
        return state.strip() in ("idle", "mix", "alloc")

    def _check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with status {p.returncode}")

    # -- use --------------------------------------------------------------------------------
    def activate(self) -> None:
        """Put the client environment (``SLURM_CONF``) into ``os.environ``."""
        os.environ.update(self.env)

    def jobs(self) -> list[str]:
        """The queue: one ``ID STATE REASON`` line per job."""
        out = self._run("squeue", "-h", "-o", "%i %T %r").stdout
        return [ln.strip() for ln in out.splitlines() if ln.strip()]

    def run(self, *cmd: str) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster."""
        return self._run(*cmd)

    def logs(self) -> str:
        """The last lines of each daemon's log (for a failure's message)."""
        out = []
        for f in sorted((self.home / "log").glob("*")):
            tail = f.read_text(errors="replace").splitlines()[-5:]
            out += [f"-- {f.name}", *tail]
        return "\n".join(out)

    def steps_left(self) -> list[str]:
        """Job-step sockets slurmstepd keeps in the spool while a step (or batch) runs."""
        spool = self.home / "spool"
        return sorted(p.name for p in spool.iterdir() if p.is_socket()) if spool.exists() else []

    # -- stop -------------------------------------------------------------------------------
    def stop(self, timeout: float = 20.0) -> None:
        """Cancel every job, wait for the queue and the steps to be gone, stop the daemons."""
        ctld = self.procs.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            try:
                if jobs := [j.split()[0] for j in self.jobs()]:
                    self._run("scancel", "--full", *jobs)
                _poll(lambda: not self.jobs(), timeout, "the queue to be empty", 0.1)
                _poll(lambda: not self.steps_left(), timeout, "the job steps to end", 0.1)
            except (TimeoutError, subprocess.SubprocessError, OSError):
                pass  # the daemons are stopped all the same
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.procs.pop(name, None)
            if p is None:
                continue
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout)
