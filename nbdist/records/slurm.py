"""Slurm as nbdist uses it: the check before submitting, a job's state and time left, its end in
words, and cancelling it. On the floor: the kernel submits and watches jobs, the server reads a
kernel's job state; imports neither ipyparallel nor torch. The launcher that writes the batch
script is the kernel's (``notebook.cluster.engines.remote.launchers.SlurmEngineSetLauncher``).

Every command runs with a deadline and never prompts; what Slurm says is turned into one line
naming the job (or the option) and the fix. ``precheck`` asks ``sbatch --test-only`` with the
options the job will have, so a partition that does not exist, a malformed time or GPUs on a
cluster without them are refused before anything starts.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import subprocess
from dataclasses import dataclass

from ..errors import UsageError

#: Seconds a Slurm command gets (slurmctld answers in milliseconds when it is up).
COMMAND_TIMEOUT = 20.0
#: States of a job that will not run again (as ``scontrol show job`` names them).
ENDED = {
    "BOOT_FAIL": "its node failed to boot",
    "CANCELLED": "it was cancelled (scancel, or an administrator)",
    "COMPLETED": "its engines all exited",
    "COMPLETING": "it was cancelled (scancel, an administrator) or failed, and is ending",
    "DEADLINE": "it reached its deadline",
    "FAILED": "it failed",
    "NODE_FAIL": "its node failed",
    "OUT_OF_MEMORY": "it ran out of memory",
    "PREEMPTED": "it was preempted by a job of higher priority",
    "REQUEUED": "it was requeued (preempted or its node failed)",
    "REVOKED": "it was revoked",
    "SPECIAL_EXIT": "it ended with a special exit",
    "TIMEOUT": "it reached its time limit",
}


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, stdin=subprocess.DEVNULL
    )


def _error_line(text: str) -> str:
    """Slurm's own reason: its ``error:`` lines, without the command's name, on one line."""
    lines = [ln.split("error:", 1)[1].strip() for ln in text.splitlines() if "error:" in ln]
    lines = lines or [ln.strip() for ln in text.splitlines() if ln.strip()]
    return "; ".join(dict.fromkeys(lines)) or "no reason given"


def sbatch_args(n: int, options: dict) -> list[str]:
    """The ``sbatch`` options a job of ``n`` engines gets from the launcher ``options``."""
    args = [f"--ntasks={n}"]
    for key, flag in (("queue", "--partition"), ("timelimit", "--time"), ("account", "--account")):
        if options.get(key):
            args.append(f"{flag}={options[key]}")
    if options.get("qos"):
        args.append(f"--qos={options['qos']}")
    if options.get("gpus_per_node"):
        args.append(f"--gpus-per-node={options['gpus_per_node']}")
    return args + [w for option in grouped(options.get("options") or "") for w in option]


def precheck(n: int, options: dict) -> None:
    """Ask Slurm whether it would take a job of ``n`` engines with these ``options``
    (``sbatch --test-only``); refuse in one line with Slurm's reason and the fix."""
    cmd = ["sbatch", "--test-only", *sbatch_args(n, options), "--wrap=true"]
    try:
        r = _run(cmd)
    except FileNotFoundError:
        raise UsageError(
            "the slurm launcher: starting engines failed (sbatch is not on PATH: run where "
            "Slurm's commands are, or install them)"
        ) from None
    except subprocess.TimeoutExpired:
        raise UsageError(
            f"slurm did not answer within {COMMAND_TIMEOUT:g} s (sbatch --test-only): is "
            "slurmctld up? (scontrol ping)"
        ) from None
    if r.returncode == 0:
        return
    reason = _error_line(r.stderr + r.stdout)
    low = reason.lower()
    if "partition" in low:
        fix = f"name one of: {', '.join(partitions()) or '(none)'} (sinfo -s), with --partition"
        fix = fix.replace("*", " (the default)")
    elif "time" in low:
        fix = "write --time as MINUTES, HH:MM:SS or DAYS-HH[:MM[:SS]] within the partition's limit"
    elif "gres" in low or "gpu" in low:
        fix = "this cluster has no such GPUs (sinfo -o '%P %G'): drop --gpus-per-node"
    else:
        fix = f"check the options ({' '.join(cmd[2:-1])})"
    raise UsageError(f"slurm refused the job: {reason}: {fix}")


def grouped(options: str) -> list[list[str]]:
    """``sbatch`` options, each with its value: ``"--mem=4G -C a100"`` → two options."""
    groups: list[list[str]] = []
    for word in shlex.split(options):
        if word.startswith("-") or not groups:
            groups.append([word])
        else:
            groups[-1].append(word)
    return groups


def partitions() -> list[str]:
    """The cluster's partition names (the default marked with ``*``), or none if unknown."""
    try:
        out = _run(["sinfo", "-h", "-o", "%P"]).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted({p.strip() for p in out.split() if p.strip()})


@dataclass(frozen=True)
class JobInfo:
    """A Slurm job as ``scontrol show job`` tells it."""

    job_id: str
    state: str  # PENDING, RUNNING, COMPLETING, CANCELLED, TIMEOUT, PREEMPTED, ...
    reason: str  # why it is pending (Priority, Resources, PartitionDown...), or "None"
    time_limit: str  # e.g. 00:10:00, 1-00:00:00, UNLIMITED
    run_time: str  # e.g. 00:00:19
    partition: str = ""
    restarts: int = 0  # times the job was requeued; it goes up while the job is still COMPLETING

    @property
    def ended(self) -> bool:
        """Whether the job will not run (again) as it was: its engines are gone."""
        return self.state in ENDED

    @property
    def time_left(self) -> str:
        """Time before the limit, as squeue writes it (``9:41``, ``1:02:03``), or UNLIMITED."""
        limit, run = seconds(self.time_limit), seconds(self.run_time)
        if limit is None:
            return "UNLIMITED" if self.time_limit.upper() in ("UNLIMITED", "INFINITE") else "?"
        return clock(max(0, limit - (run or 0)))

    def line(self) -> str:
        """One line for ``%nbdist status``: ``slurm job 42: RUNNING, 9:41 left``."""
        if self.state == "PENDING":
            return f"slurm job {self.job_id}: queued ({self.reason})"
        if self.ended:
            return f"slurm job {self.job_id}: {self.state} ({ENDED[self.state]})"
        left = self.time_left
        limit = "no time limit" if left == "UNLIMITED" else f"{left} left"
        return f"slurm job {self.job_id}: {self.state}, {limit}"

    def end_line(self) -> str:
        """Why the job's engines are gone, in one line naming the job and the reason."""
        why = ENDED.get(self.state, self.state.lower())
        limit, run = seconds(self.time_limit), seconds(self.run_time)
        if self.state == "COMPLETING" and self.restarts > 0:
            return dataclasses.replace(self, state="REQUEUED").end_line()  # ending, then queued
        if self.state == "COMPLETING" and limit is not None and run is not None and run >= limit:
            return dataclasses.replace(self, state="TIMEOUT").end_line()  # still ending
        if self.state == "TIMEOUT":
            why += f" ({self.time_limit})"
        if self.reason not in ("", "None"):
            why += f", reason {self.reason}"
        return f"slurm job {self.job_id} ended: {self.state}: {why}"


_DURATION = re.compile(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)\Z")


def seconds(text: str) -> int | None:
    """``D-HH:MM:SS`` / ``HH:MM:SS`` / ``MM:SS`` in seconds; None for UNLIMITED and the like."""
    m = _DURATION.match(text.strip())
    if m is None:
        return None
    d, h, mi, s = (int(x or 0) for x in m.groups())
    return ((d * 24 + h) * 60 + mi) * 60 + s


def clock(total: int) -> str:
    """Seconds as squeue writes a duration: ``M:SS``, ``H:MM:SS`` or ``D-HH:MM:SS``."""
    d, rest = divmod(total, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    if d:
        return f"{d}-{h:02d}:{m:02d}:{s:02d}"
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def query(job_id: str) -> JobInfo | None:
    """The job's state now; None when Slurm no longer knows it (or cannot be asked)."""
    try:
        r = _run(["scontrol", "show", "job", "-o", str(job_id)])
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    fields = dict(w.split("=", 1) for w in r.stdout.split() if "=" in w)
    if "JobState" not in fields:
        return None
    return JobInfo(
        job_id=str(job_id),
        state=fields["JobState"],
        reason=fields.get("Reason", "None"),
        time_limit=fields.get("TimeLimit", "UNLIMITED"),
        run_time=fields.get("RunTime", "0:00"),
        partition=fields.get("Partition", ""),
        restarts=int(restarts) if (restarts := fields.get("Restarts", "0")).isdigit() else 0,
    )


def cancel(job_id: str) -> None:
    """Cancel the job (nothing when it is already gone)."""
    try:
        _run(["scancel", str(job_id)])
    except (OSError, subprocess.SubprocessError):
        pass
