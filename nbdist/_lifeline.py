"""Tie a controller or engine to the notebook kernel that started it.

Loaded from the cluster profile's config files, so it runs in the controller and in every local
engine before they do anything else. When the kernel dies (even by SIGKILL, where no exit handler
runs), its children see their parent change and exit: no orphans after a kernel crash.
"""

from __future__ import annotations

import os
import threading
import time

_PARENT_ENV = "NBDIST_PARENT_PID"


def exit_with_parent(period: float = 0.5) -> None:
    """Exit this process soon after the process named by ``$NBDIST_PARENT_PID`` is gone."""
    parent = int(os.environ.get(_PARENT_ENV, "0") or 0)
    if parent <= 1 or os.getppid() != parent:
        return  # not started by a kernel on this host (e.g. over ssh): heartbeats cover it

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(period)
        os._exit(0)

    threading.Thread(target=watch, name="nbdist-lifeline", daemon=True).start()
