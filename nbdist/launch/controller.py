"""A cluster's ipyparallel controller (local or remote engines), leaving without teardown.

Its heart monitor is ``heart.QuickHeartMonitor``: a slow beat, and new engines registered at
once. The controller stops at its SIGTERM in a few milliseconds (its schedulers and heart monitor
are told to leave, its connection files removed); the interpreter's teardown of everything it
imported then takes a third of a second of CPU and frees nothing the OS would not. Here the
controller runs as ipyparallel runs it, waits for its own children, and exits.

It keeps no database of tasks (ipyparallel's ``NoDB``): nbdist never asks the hub for a past
result, and the default in-memory one kept every task's whole printed output, up to 1,024 tasks
(a hub of 62 MB grew to 136 MB after cells printing 5, 20 and 40 MB).
Runs as ``python -m nbdist.launch.controller ARGS`` (ipyparallel's controller arguments).
"""

from __future__ import annotations

import multiprocessing
import os
import sys

_CHILD_WAIT = 5.0  # seconds to wait for the schedulers, told to leave, before leaving anyway
_NO_DB = "--IPController.db_class=NoDB"  # first: an argument given after it still decides


def main() -> None:
    from ipyparallel.controller.app import main as controller

    from .heart import install

    install()  # a slow beat, and new engines registered at once
    sys.argv[1:1] = [_NO_DB]
    code = 1
    try:
        controller()
        code = 0
    finally:
        for child in multiprocessing.active_children():  # reaped: no zombie for init to take
            child.join(_CHILD_WAIT)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)


if __name__ == "__main__":
    main()
