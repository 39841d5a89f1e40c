"""Tie a controller, fork server or engine to the notebook kernel that started it.

Loaded from the cluster profile's config files (and by the fork server), so it runs in every
process of a local cluster before they do anything else. When the kernel is gone (even killed by
SIGKILL, where no exit handler runs), each process kills what it started and exits: no orphans.
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
    """Exit this process soon after the kernel named by ``$NBDIST_PARENT_PID`` is gone.

    Does nothing where the variable is unset (engines started over ssh: heartbeats cover them).
    """
    import psutil

    try:
        kernel = psutil.Process(int(os.environ.get(_PARENT_ENV, "0") or 0))
    except (ValueError, psutil.Error):
        return
    if kernel.pid <= 1:
        return

    def alive() -> bool:
        try:
            return kernel.is_running() and kernel.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def watch() -> None:
        while alive():
            time.sleep(period)
        _kill_descendants()  # the controller's schedulers, an engine's data-loader workers
        os._exit(0)

    threading.Thread(target=watch, name="nbdist-lifeline", daemon=True).start()
