"""What is in use now, and so kept whatever the retention rule says.

- A cluster runs while the controller its cluster file (``profile/security/cluster-<id>.json``)
  names runs: the process, not a zombie, as the server's cluster list judges it. A pid given to
  another process since keeps that cluster's files too: the safe side.
- A cluster host (the sidebar's) runs while ``records.registry.host_alive`` says so; its cluster
  with it.
- A run runs while the run store says ``running`` (its writer touched it in the last minute):
  its cluster, its sweep trial's checkpoint folder (``<sweep>-<trial>``).
- The kernel's own cluster, and the run keys of the cells its journal holds.

Checkpoint folders written since the earliest of these started may hold a run of theirs named by
the person (``run="exp1"``): kept. An earlier run's folder set aside (``<key>.earlier-<time>``)
is never in use. Anything modified in the last ``GRACE`` seconds is kept: a cluster that is
starting has files before its cluster file exists.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ...records import registry

#: Seconds during which a new file is never judged (a cluster starting, a checkpoint written).
GRACE = 120.0
#: What an earlier run's checkpoint folder, set aside when a new run took its name, is called.
EARLIER = ".earlier-"
_HOST_FILE = re.compile(r"host-(\d+)\.(json|sock|lease)")


@dataclass(frozen=True)
class InUse:
    """The clusters (ids) and hosts (pids) running, checkpoint run keys in use, and since when
    (``since``, a time.time(); None when nothing runs), as seen at ``now``."""

    clusters: frozenset[str] = frozenset()
    hosts: frozenset[int] = frozenset()
    keys: frozenset[str] = frozenset()
    since: float | None = None
    now: float = field(default_factory=time.time)

    def young(self, mtime: float) -> bool:
        """Modified within the last ``GRACE`` seconds: not judged yet."""
        return mtime > self.now - GRACE

    def holds(self, key: str, mtime: float) -> str | None:
        """Why the checkpoint folder ``key`` (last written at ``mtime``) is in use; None if not."""
        if self.young(mtime):
            return "written in the last minutes"
        if EARLIER in key:
            return None
        if key in self.keys:
            return "of a running run or this kernel's cluster"
        if any(key.startswith(f"{c}-") for c in self.clusters):
            return "of a running cluster"
        if self.since is not None and mtime >= self.since:
            return "written since a running cluster started"
        return None


def look(root: Path, runs: list[dict] | None, current: Any = None) -> InUse:
    """What is in use in the data folder ``root`` now: ``runs`` are the run store's runs (as
    ``RunStore.list_runs`` gives them; None: unknown), ``current`` the kernel's cluster."""
    clusters: set[str] = set()
    keys: set[str] = set()
    starts: list[float | None] = []
    for f in (root / "profile" / "security").glob("cluster-*.json"):
        cid, started = _controller(f)
        if cid is not None:
            clusters.add(cid)
            starts.append(started)  # None: not known (the rule by its id still holds)
    hosts = set()
    for pid in _host_pids(root / "clusters"):
        if registry.host_alive(pid):
            hosts.add(pid)
            record = registry.read(root / "clusters" / f"host-{pid}.json")
            if record is not None:
                clusters.add(record.cluster_id or "")
                starts.append(record.started)
    for run in runs or ():
        if run.get("status") == "running":
            clusters.add(run.get("cluster_id") or "")
            starts.append(run.get("started"))
            options = run.get("options") or {}
            if "sweep" in options and "trial" in options:
                keys.add(f"{options['sweep']}-{options['trial']}")
    if current is not None:
        clusters.add(str(getattr(current.engines, "cluster_id", "") or ""))
        keys.update(e.run_key for e in current.journal if hasattr(e, "run_key"))
    clusters.discard("")
    since = min((s for s in starts if s), default=None)
    return InUse(frozenset(clusters), frozenset(hosts), frozenset(keys), since)


def _controller(cluster_file: Path) -> tuple[str | None, float | None]:
    """The cluster id of ``cluster_file`` and when its controller started, if it runs."""
    try:
        d = json.loads(cluster_file.read_text())
        cid = d["cluster"]["cluster_id"]
        pid = (d.get("controller") or {}).get("state", {}).get("pid")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None, None  # unreadable: judged by its age alone
    if not isinstance(pid, int) or pid <= 0:
        return None, None
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None, None
        return str(cid), p.create_time()
    except psutil.NoSuchProcess:
        return None, None
    except psutil.Error:  # not ours to read: it may be the controller, keep its files
        return str(cid), None


def _host_pids(folder: Path) -> set[int]:
    """The pids that host records, sockets and leases in ``folder`` name."""
    try:
        names = [p.name for p in folder.iterdir()]
    except OSError:
        return set()
    return {int(m.group(1)) for n in names if (m := _HOST_FILE.fullmatch(n))}
