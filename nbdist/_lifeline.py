"""Tie a controller, fork server or engine to the notebook kernel that started it.

Loaded from the cluster profile's config files (and by the fork server), so it runs in every
process of a local cluster before they do anything else. When the kernel is gone (even killed by
SIGKILL, where no exit handler runs), each process kills what it started and exits: no orphans.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

_PARENT_ENV = "NBDIST_PARENT_PID"


def kill_descendants() -> None:
    """Kill every process this one started (and theirs), by PID."""
    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass
    except Exception:
        pass


def parent_check() -> Callable[[], bool] | None:
    """A function telling whether the kernel named by ``$NBDIST_PARENT_PID`` is still there;
    None where the variable is unset (engines started over ssh: heartbeats cover them)."""
    import psutil

    try:
        kernel = psutil.Process(int(os.environ.get(_PARENT_ENV, "0") or 0))
    except (ValueError, psutil.Error):
        return None
    if kernel.pid <= 1:
        return None

    def alive() -> bool:
        try:
            return kernel.is_running() and kernel.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    return alive


def exit_with_parent(period: float = 0.5) -> None:
    """Exit this process soon after the kernel is gone (a watcher thread; see ``parent_check``;
    the fork server, which must stay single-threaded, checks from its own loop instead)."""
    alive = parent_check()
    if alive is None:
        return

    def watch() -> None:
        while alive():
            time.sleep(period)
        kill_descendants()  # the controller's schedulers, an engine's data-loader workers
        os._exit(0)

    threading.Thread(target=watch, name="nbdist-lifeline", daemon=True).start()
