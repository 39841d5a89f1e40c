"""The scheduler's jobs of a remote engine set (Slurm): which job holds which engine, the wait
for a queued job, why a job's engines left, the job's line in ``%nbdist status``, and a guard per
job that cancels it when the kernel is gone.

The guard is a small process (a child of the kernel, in a session of its own) that reads a pipe
whose only writer is the kernel: when the kernel exits or is killed, the pipe ends (or the guard
finds itself orphaned, within a second) and the guard runs ``scancel``, so not even a job still
in the queue is left behind. ``stop`` closes the pipes
itself (the guards cancel, if the launcher has not yet) and waits for the guards by PID.

A job can end under a running cell (``scancel``, its time limit, preemption) while its engines
outlive the scheduler's SIGTERM for a while (Slurm's ``KillWait``): ``watch`` asks the scheduler
every ``WATCH`` seconds, from a thread, and reports a job that no longer runs at once, so its
engines count as lost within seconds whatever the cell is doing.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from .....errors import NbdistError
from .....records import slurm
from ..base import EngineExit


@dataclass(frozen=True)
class RemoteExit(EngineExit):
    """A remote engine left the cluster: its process ended, or its host stopped answering
    (the controller cannot tell which, nor the exit status), or its job ended (``reason``)."""

    status: int | None = None  # unknown: the controller cannot tell
    host: str = "?"
    engine_id: int = -1
    reason: str = ""  # the scheduler ended its job: which job, and why

    def describe(self) -> str:
        if self.reason:
            return f"on host {self.host} left the cluster: {self.reason}"
        return f"on host {self.host} left the cluster (it ended, or its host stopped answering)"


#: Runs in the guard: wait for the pipe to end (or for the kernel to be gone: a child it forked
#: may hold the pipe open), then cancel the job named on its command line.
_GUARD = """
import os, select, subprocess, sys
kernel = os.getppid()
while os.getppid() == kernel:
    if select.select([sys.stdin], [], [], 1.0)[0] and not os.read(sys.stdin.fileno(), 512):
        break
subprocess.run(["scancel", sys.argv[1]], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
               stderr=subprocess.DEVNULL, timeout=60)
"""
#: Seconds between two questions to the scheduler while engines are awaited.
POLL = 0.5
#: Seconds between two questions to the scheduler about running jobs (``watch``).
WATCH = 1.0


@dataclass
class Job:
    """One submitted job: its id, its engine set, its guard, what is known of its engines."""

    job_id: str
    set_id: str
    guard: subprocess.Popen | None = None
    engines: set[int] = field(default_factory=set)
    told_queued: bool = False
    end: str = ""  # why its engines left, once known


class SchedulerJobs:
    """The jobs of one engine set, when its launcher is a scheduler's (Slurm); inert otherwise."""

    def __init__(self, launcher: str):
        self.active = launcher == "slurm"
        self.jobs: dict[str, Job] = {}  # by engine set id
        self._of_engine: dict[int, Job] = {}
        self._asked = 0.0
        self._quit = threading.Event()
        self._watcher: threading.Thread | None = None

    def watch(self, ended: Callable[[Job], None]) -> None:
        """From now until ``stop``: call ``ended(job)`` once for each job with engines that
        the scheduler says no longer runs (its ``end`` set), within ``WATCH`` seconds."""
        if not self.active or self._watcher is not None:
            return

        def loop() -> None:
            while not self._quit.wait(WATCH):
                for job in list(self.jobs.values()):
                    if job.engines and not job.end and self._ended(job):
                        ended(job)

        self._watcher = threading.Thread(target=loop, name="nbdist-slurm-watch", daemon=True)
        self._watcher.start()

    def _ended(self, job: Job) -> bool:
        """Whether ``job`` no longer runs its engines (``job.end`` then says why)."""
        info = slurm.query(job.job_id)
        if info is not None and info.ended:
            job.end = info.end_line()
        elif info is not None and info.state == "PENDING":  # requeued: these engines are gone
            job.end = f"slurm job {job.job_id} was requeued ({info.reason})"
        return bool(job.end)

    def launched(self, set_id: str, engine_set: object) -> None:
        """Note the job an engine set submitted, and start its guard."""
        job_id = getattr(engine_set, "job_id", "")
        if not self.active or not job_id:
            return
        guard = subprocess.Popen(
            [sys.executable, "-c", _GUARD, str(job_id)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # an interrupt of the kernel does not reach it
        )
        self.jobs[set_id] = Job(str(job_id), set_id, guard)

    def waiting(self, set_ids: list[str], timeout: float, timed_out: bool) -> None:
        """While engines are awaited: say once that a job is queued (with the scheduler's
        reason); raise one line naming the job when it ended, or is still queued at the
        deadline (``timed_out``)."""
        now = time.monotonic()
        if not self.active or (now - self._asked < POLL and not timed_out):
            return
        self._asked = now
        for set_id in set_ids:
            job = self.jobs.get(set_id)
            info = slurm.query(job.job_id) if job is not None else None
            if info is None:
                continue
            if info.state == "PENDING" and timed_out:
                raise NbdistError(
                    f"slurm job {job.job_id} still queued after {timeout:g} s ({info.reason}); "
                    "it was cancelled: allow longer with --start-timeout, or pick another "
                    "--partition"
                )
            if info.state == "PENDING" and info.reason != "None" and not job.told_queued:
                job.told_queued = True
                print(
                    f"nbdist: slurm job {job.job_id} is queued ({info.reason}); waiting up "
                    f"to {timeout:g} s (--start-timeout)",
                    flush=True,
                )
            if info.ended:
                raise NbdistError(f"{info.end_line()}, before its engines registered")

    def assign(self, engine_ids: list[int], set_ids: list[str]) -> None:
        """These new engines came from these engine sets (one job per launch: its engines)."""
        jobs = [self.jobs[s] for s in set_ids if s in self.jobs]
        if len(jobs) == 1:
            jobs[0].engines.update(engine_ids)
            self._of_engine.update(dict.fromkeys(engine_ids, jobs[0]))

    def why_gone(self, engine_id: int) -> str:
        """Why an engine left, when its job ended (one line naming the job); "" otherwise."""
        job = self._of_engine.get(engine_id)
        if job is None:
            return ""
        if not job.end:
            self._ended(job)
        return job.end

    def announce_ended(self) -> None:
        """Before a new job replaces ended ones: say which ended, and why, once each."""
        for job in list(self.jobs.values()):
            if job.engines and not job.end:
                self.why_gone(next(iter(job.engines)))  # its engines' exits may still be on the way
            if job.end and job.engines:
                print(f"nbdist: {job.end}; a new job takes its ranks", flush=True)
                job.engines.clear()
                slurm.cancel(job.job_id)  # requeued (preempted): it must not come back

    def status_line(self) -> str:
        """The job(s) holding the engines now, as ``slurm job 42: RUNNING, 9:41 left`` (or
        ``slurm job 42: TIMEOUT (it reached its time limit)`` once it ended)."""
        lines = []
        for job in self.jobs.values():
            if job.engines:
                info = slurm.query(job.job_id)
                lines.append(info.line() if info else f"slurm job {job.job_id}: gone")
        return "; ".join(lines)

    def pids(self) -> list[int]:
        """The guards' pids (processes of this engine set on this machine)."""
        return [j.guard.pid for j in self.jobs.values() if j.guard and j.guard.poll() is None]

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel every job (through its guard: its pipe ends) and wait for the guards."""
        self._quit.set()
        if self._watcher is not None:
            self._watcher.join(timeout)
        guards = [j.guard for j in self.jobs.values() if j.guard is not None]
        for g in guards:
            try:
                g.stdin.close()
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        for g in guards:
            try:
                g.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill(g.pid)
                g.wait(timeout)
        for j in self.jobs.values():
            j.guard = None


def _kill(pid: int) -> None:
    """Kill our guard, by its pid."""
    try:
        psutil.Process(pid).kill()
    except psutil.Error:
        pass
