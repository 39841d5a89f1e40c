"""Processes and files of nbdist's clusters on this machine, shared by every engine set.

nbdist's ipyparallel profile (``profile_dir``) is private to its owner and ties each controller
and engine to the kernel that started it (``nbdist._lifeline``). Processes are only ever ended
by PID, and only those an engine set knows it started (``signal_own``, ``reap``). Imports no
ipyparallel and no torch: the Jupyter server uses ``profile_dir`` too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

from ... import config

#: Written into the profile's controller and engine config files.
CONFIG_FILE = """\
# Written by nbdist: controller and engines leave when the kernel that started them is gone.
import nbdist._lifeline
nbdist._lifeline.exit_with_parent()
"""


def private_dir(path: Path) -> Path:
    """``path``, made if missing, readable by its owner alone (mode 0700)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def profile_dir() -> Path:
    """nbdist's ipyparallel profile: cluster files, connection files, engine logs."""
    private_dir(config.data_dir())
    path = private_dir(config.data_dir() / "profile")
    for name in ("ipcontroller_config.py", "ipengine_config.py"):
        f = path / name
        if not f.exists() or f.read_text() != CONFIG_FILE:
            f.write_text(CONFIG_FILE)
    return path


def owner_only(security: Path) -> None:
    """Connection and cluster files hold keys and addresses: readable by their owner alone."""
    os.chmod(security, 0o700)
    for f in security.glob("*.json"):
        os.chmod(f, 0o600)


def tie_to_this_process() -> None:
    """Name this process (the kernel) as the one whose end ends the processes started from it
    (read by ``nbdist._lifeline`` in the controller, the fork server and local engines)."""
    os.environ["NBDIST_PARENT_PID"] = str(os.getpid())


def tree(pids: Iterable[int]) -> list[psutil.Process]:
    """The processes ``pids`` and all their descendants (those still running), each once."""
    procs: list[psutil.Process] = []
    for pid in dict.fromkeys(pids):
        try:
            p = psutil.Process(pid)
            procs += [p, *p.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    return procs


def reap(procs: list[psutil.Process], timeout: float) -> None:
    """Wait for ``procs`` to leave; kill (by PID) those still there after ``timeout`` s."""
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=timeout)


def signal_own(pids: Iterable[int], own: set[int], sig: int) -> None:
    """Send ``sig`` to those of ``pids`` that are in ``own`` (never to a stranger's pid)."""
    for pid in pids:
        if pid in own:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def wait_for(predicate: Callable[[], object], timeout: float, period: float = 0.02) -> bool:
    """Poll ``predicate`` until it is true (True) or ``timeout`` s have passed (False)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(period)
    return True


def remove_cluster_files(profile: Path, cluster_id: str) -> None:
    """No stale records: a cluster's ipyparallel cluster file, connection files and hub state."""
    security = profile / "security"
    for f in [
        *security.glob(f"cluster-{cluster_id}.json"),
        *security.glob(f"ipcontroller-{cluster_id}-*.json"),
        *(profile / "log").glob(f"engines{cluster_id}.json"),
    ]:
        f.unlink(missing_ok=True)


def close_quietly(closable: object | None) -> None:
    """``closable.close()``, where an error only means there is nothing left to close."""
    if closable is not None:
        try:
            closable.close()
        except Exception:
            pass
