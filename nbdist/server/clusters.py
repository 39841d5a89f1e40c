"""The server's view of the clusters on this machine, and the sidebar's start and stop actions.

Two sources, both on the floor (``records``): the records of cluster hosts (clusters started
from the sidebar, ``registry``) and ipyparallel's cluster files in nbdist's profile (``profile``:
every nbdist cluster has one, including those a notebook kernel started with ``%nbdist start``),
with the Slurm job that holds a kernel's engines (``slurm``). Starting a cluster spawns a host
process (``python -m nbdist.host``) and returns at once: the server never imports the kernel's
code nor torch, nor waits for engines. Listing writes nothing (the sidebar polls it); a data
folder that is not fit is a one-line UsageError.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import psutil

from .. import datadir
from ..errors import trim, trim_repr
from ..records import registry, slurm
from ..records.profile import profile_path

#: How long the sidebar shows a host that failed to start.
FAILED_SHOWN_FOR = 600.0

_ENGINE_LOG = re.compile(r"engine-(\d+)\.log$")


class ClusterError(Exception):
    """A request the server refuses: ``status`` is the HTTP status, the message says why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Clusters:
    """Lists clusters and starts and stops the ones the sidebar owns (one per server)."""

    def __init__(self) -> None:
        self._children: dict[int, tuple[subprocess.Popen, Path]] = {}  # hosts we started
        self._failed: list[dict] = []

    # -- actions ------------------------------------------------------------------------------
    def start(self, n: int) -> dict:
        """Spawn a cluster host for ``n`` engines; return its entry (state ``starting``)."""
        folder = registry.records_dir(create=True)
        log = folder / f"host-start-{time.time_ns()}.log"
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", registry.HOST_MODULE, "--n", str(n)],
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # the server's Ctrl-C is not for the cluster
                close_fds=True,
            )
        finally:
            os.close(fd)
        self._children[proc.pid] = (proc, log)
        return _entry(
            cluster_id=None,
            owner="sidebar",
            state="starting",
            pid=proc.pid,
            n=n,
            started=time.time(),
        )

    def stop(self, cluster_id: str) -> dict:
        """Ask the host of ``cluster_id`` to stop its cluster; return at once (``stopping``)."""
        for rec in registry.live():
            if rec.cluster_id == cluster_id:
                host = registry.host_process(rec.pid)
                try:  # the process checked to be the host, not a later one with its pid
                    if host is None:
                        break
                    host.send_signal(signal.SIGTERM)
                except psutil.NoSuchProcess:
                    break
                return _entry(
                    cluster_id=cluster_id,
                    owner="sidebar",
                    state="stopping",
                    pid=rec.pid,
                    n=rec.n,
                    started=rec.started,
                )
        if any(c["cluster_id"] == cluster_id for c in self._kernel_clusters(set(), set())):
            raise ClusterError(
                409,
                f"cluster {cluster_id} belongs to a notebook kernel: stop it there with "
                "%nbdist stop (or shut that kernel down)",
            )
        raise ClusterError(404, f"no running cluster {trim_repr(cluster_id)}: refresh the list")

    # -- listing ------------------------------------------------------------------------------
    def list(self) -> list[dict]:
        """Every cluster on this machine: starting, running or stopping, or recently failed."""
        datadir.check()
        self._reap()
        out: list[dict] = []
        seen_hosts: set[int] = set()
        for rec in registry.live():
            seen_hosts.add(rec.pid)
            out.append(
                _entry(
                    cluster_id=rec.cluster_id,
                    owner="sidebar",
                    state=rec.state,
                    pid=rec.pid,
                    n=rec.n,
                    started=rec.started,
                    backend=rec.backend if rec.cluster_id else None,  # known once running
                    engines=[_engine(e.get("pid"), e.get("rank")) for e in _current(rec.engines)],
                )
            )
        for pid, (proc, _) in self._children.items():
            if pid not in seen_hosts and proc.poll() is None:  # before its first record
                out.append(_entry(cluster_id=None, owner="sidebar", state="starting", pid=pid))
        ids = {c["cluster_id"] for c in out if c["cluster_id"]}
        out += self._kernel_clusters(ids, seen_hosts)
        now = time.time()
        self._failed = [f for f in self._failed if now - f["started"] < FAILED_SHOWN_FOR]
        return out + self._failed

    def _reap(self) -> None:
        """Collect hosts that ended; remember why the ones that failed did."""
        for pid, (proc, log) in list(self._children.items()):
            code = proc.poll()
            if code is None:
                continue
            del self._children[pid]
            text = ""
            try:
                text = log.read_text(errors="replace")
            except OSError:
                pass
            try:  # the server's own files, about its own child: not the user's data
                log.unlink(missing_ok=True)
                registry.remove(pid)  # a host that died without cleaning up
            except OSError:
                pass
            if code != 0:
                self._failed.append(
                    _entry(
                        cluster_id=None,
                        owner="sidebar",
                        state="failed",
                        pid=pid,
                        started=time.time(),
                        error=trim(text.strip(), head=5, tail=10) or f"exit status {code}",
                    )
                )

    def _kernel_clusters(self, known_ids: set[str], host_pids: set[int]) -> list[dict]:
        """Clusters whose controller runs, from ipyparallel's cluster files in nbdist's profile."""
        profile = profile_path()
        out = []
        for f in sorted((profile / "security").glob("cluster-*.json")):
            try:
                d = json.loads(f.read_text())
                cid = d["cluster"]["cluster_id"]
                ctl_pid = (d.get("controller") or {}).get("state", {}).get("pid")
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue
            if cid in known_ids or not _running(ctl_pid) or _ancestors(ctl_pid) & host_pids:
                continue  # gone, or a host's cluster not ready yet
            log_dir = profile / "log" / cid
            pids = sorted(
                int(m.group(1)) for p in _listdir(log_dir) if (m := _ENGINE_LOG.match(p.name))
            )
            try:
                started = f.stat().st_mtime
            except OSError:
                started = None
            out.append(
                _entry(
                    cluster_id=cid,
                    owner="kernel",
                    state="running",
                    pid=ctl_pid,
                    started=started,
                    engines=[_engine(p, None) for p in pids],
                    job=_slurm_job(d),
                )
            )
        return out


#: Slurm jobs asked about lately: job id -> (when, what Slurm said); the sidebar polls often.
_JOBS: dict[str, tuple[float, dict | None]] = {}
JOB_FRESH_FOR = 2.0


def _slurm_job(cluster: dict) -> dict | None:
    """The newest Slurm job of a kernel's cluster (ipyparallel's cluster file names each engine
    set's job): its id, state, reason, time left and status line; None for other launchers."""
    sets = (cluster.get("engines") or {}).get("sets") or {}
    ids = [str(s["job_id"]) for s in sets.values() if isinstance(s, dict) and s.get("job_id")]
    if not ids:
        return None
    job_id, now = ids[-1], time.monotonic()
    when, job = _JOBS.get(job_id, (0.0, None))
    if now - when > JOB_FRESH_FOR:
        info = slurm.query(job_id)
        job = {"id": job_id, "state": "gone", "reason": "", "time_left": "", "line": ""}
        if info is not None:
            job.update(state=info.state, reason=info.reason, time_left=info.time_left)
        job["line"] = info.line() if info else f"slurm job {job_id}: gone"
        if len(_JOBS) > 256:  # jobs of clusters long gone
            _JOBS.clear()
        _JOBS[job_id] = (now, job)
    return job


def _listdir(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except OSError:
        return []


def _running(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _ancestors(pid: int) -> set[int]:
    """The processes ``pid`` descends from (a controller: its kernel or sidebar host, and the
    fork server between them when it was forked from one)."""
    try:
        return {p.pid for p in psutil.Process(pid).parents()}
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return set()


def _current(engines: Iterable[dict]) -> list[dict]:
    """The engines a cluster has now: of those started for one rank, the latest (a replaced
    engine is not a dead one of the cluster's: "4/4 alive", not "4/5")."""
    latest: dict[object, dict] = {}
    for i, e in enumerate(engines):
        latest[e.get("rank") if e.get("rank") is not None else ("no rank", i)] = e
    return list(latest.values())


def _engine(pid: object, rank: object) -> dict:
    return {"pid": pid, "rank": rank, "alive": _running(pid)}


def _entry(
    *,
    cluster_id,
    owner,
    state,
    pid,
    n=None,
    started=None,
    backend=None,
    engines=None,
    error=None,
    job=None,
) -> dict:
    out = {
        "cluster_id": cluster_id,
        "owner": owner,
        "state": state,
        "pid": pid,
        "n": n if n is not None else (len(engines) if engines else None),
        "started": started,
        "backend": backend,
        "engines": engines or [],
        "job": job,  # the Slurm job holding a kernel's engines (_slurm_job), else None
    }
    if error:
        out["error"] = error
    return out
