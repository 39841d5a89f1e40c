"""Records of the clusters that cluster hosts hold, one JSON file each in ``data_dir()/clusters``.

A cluster host (``nbdist.host``, started from the sidebar) writes ``host-<pid>.json`` when it
starts and rewrites it when its cluster is ready; it removes it when it leaves. Records are
written atomically (never half-written) and readable by their owner alone, in a directory of
mode 0700 that also holds each host's control socket. The server lists these records and
``nbdist.attach()`` connects a notebook to the cluster one describes: on the floor, so that
host, server and kernel read them without importing each other. A record is a
``records.host.HostRecord``; files that do not hold one are skipped. Beside each record, the host's
lease file (``lease_path``): the attached notebook's lock (see ``engines.hosted.Lease``).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import psutil

from .. import config, datadir
from ..errors import UsageError
from .host import HostRecord

#: The module a cluster host runs as (``python -m``): how its process is told from others.
HOST_MODULE = "nbdist.host"


def records_dir(create: bool = False) -> Path:
    """The directory of host records and control sockets (made, mode 0700, when ``create``)."""
    if create:
        return datadir.private_dir(datadir.ensure() / "clusters")
    return config.data_dir() / "clusters"


def record_path(pid: int) -> Path:
    """Where the host with this pid keeps its record."""
    return records_dir() / f"host-{pid}.json"


def socket_path(pid: int) -> Path:
    """Where the host with this pid listens for attached notebooks."""
    return records_dir() / f"host-{pid}.sock"


def write(record: HostRecord) -> None:
    """Write ``record`` (which names its host's ``pid``) atomically, mode 0600."""
    folder = records_dir(create=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".record-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:  # mkstemp makes it 0600
            json.dump(record.to_dict(), f, indent=1)
        os.replace(tmp, record_path(record.pid))
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def lease_path(pid: int) -> Path:
    """The lock file of the notebook attached to the host with this pid."""
    return records_dir() / f"host-{pid}.lease"


def remove(pid: int) -> None:
    """Forget the record, socket and lease file of the host with this pid."""
    for path in (record_path(pid), socket_path(pid), lease_path(pid)):
        path.unlink(missing_ok=True)


def host_process(pid: int | None) -> psutil.Process | None:
    """The running cluster host ``pid`` (not a zombie, not a recycled pid), or None; signal it
    through this object: psutil refuses a pid that was given to another process since."""
    if not pid:
        return None
    try:
        p = psutil.Process(pid)
        if p.status() != psutil.STATUS_ZOMBIE and HOST_MODULE in " ".join(p.cmdline()):
            return p
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass
    return None


def host_alive(pid: int | None) -> bool:
    """True while ``pid`` is a running cluster host (not a zombie, not a recycled pid)."""
    return host_process(pid) is not None


def read(path: Path) -> HostRecord | None:
    """The record in ``path``; None when it cannot be read or holds no host record."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # being replaced this very moment, or not ours
    if not isinstance(data, dict) or not isinstance(data.get("pid"), int):
        return None
    try:
        return HostRecord.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # written by another version, or not ours


def read_all() -> list[HostRecord]:
    """Every record on disk, live or stale, newest first; unreadable files are skipped. A data
    folder that is not fit (``datadir.check``) is a one-line UsageError; nothing is written."""
    datadir.check()
    folder = records_dir()
    if not folder.is_dir():
        return []
    out = [r for f in folder.glob("host-*.json") if (r := read(f)) is not None]
    out.sort(key=lambda r: r.started or 0, reverse=True)
    return out


def live() -> list[HostRecord]:
    """Records of hosts that are still running, newest first."""
    return [r for r in read_all() if host_alive(r.pid)]


def find(cluster_id: str | None = None) -> HostRecord:
    """The running cluster ``cluster_id`` (default: the newest one), or a one-line UsageError."""
    ready = [r for r in live() if r.state == "running"]
    if cluster_id is None:
        if not ready:
            raise UsageError(
                "no cluster to attach to: start one from the nbdist sidebar, or here with "
                "%nbdist start -n 2"
            )
        return ready[0]
    for r in ready:
        if r.cluster_id == cluster_id:
            return r
    known = ", ".join(str(r.cluster_id) for r in ready) or "none"
    raise UsageError(
        f"no running cluster {cluster_id!r} (running: {known}); "
        "%nbdist attach with no id takes the newest"
    )
