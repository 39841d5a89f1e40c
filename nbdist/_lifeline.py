"""Tie a controller or engine to the notebook kernel that started it.

Loaded from the cluster profile's config files, so it runs in the controller and in every local
engine before they do anything else. When the kernel dies (even by SIGKILL, where no exit handler
runs), its children see their parent change, kill what they started, and exit: no orphans.
"""

from __future__ import annotations

import os
import threading
import time

_PARENT_ENV = "NBDIST_PARENT_PID"


def _kill_descendants() -> None:
    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass
    except Exception:
        pass


def exit_with_parent(period: float = 0.5) -> None:
    """Exit this process soon after the process named by ``$NBDIST_PARENT_PID`` is gone."""
    parent = int(os.environ.get(_PARENT_ENV, "0") or 0)
    if parent <= 1 or os.getppid() != parent:
        return  # not started by a kernel on this host (e.g. over ssh): heartbeats cover it

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(period)
        _kill_descendants()  # the controller's schedulers, an engine's data-loader workers
        os._exit(0)

    threading.Thread(target=watch, name="nbdist-lifeline", daemon=True).start()
