"""What a cluster's processes are called in ``ps``, ``top`` and ``/proc``.

Every local process of a cluster is the fork server or forked from it, so all of them were
``python -m nbdist.launch.forkserver``: an engine could not be told from the controller, nor one
cluster's from another's. Each names itself once it knows what it is: ``nbdist forkserver
(cluster nbdist-1a2b3c4d)``, ``nbdist controller (cluster ...)``, ``nbdist engine (cluster
...)``, then ``nbdist engine 3 (cluster ...)`` once it holds rank 3. The whole command line
(``/proc/PID/cmdline``, within its length: the environment after it is left alone) becomes
the name with ``setproctitle``; without it, the kernel's short
name (``/proc/PID/comm``, 15 characters) does, through ``prctl(PR_SET_NAME)``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_PR_SET_NAME = 15
_named: str | None = None  # the title this process gave itself, if any


def name(title: str) -> None:
    """Call this process ``title`` (see the module's text); nothing where neither way works."""
    global _named
    _named = title
    # Within the command line's own bytes: beyond them setproctitle would write over the
    # environment's, which others read from outside (/proc/PID/environ: the kernel's identity).
    os.environ.setdefault("SPT_NOENV", "1")
    try:
        from setproctitle import setproctitle
    except ImportError:  # the short name only
        _comm(title)
        return
    setproctitle(title)


def of(what: str, cluster: str = "", rank: int | None = None) -> str:
    """The title of ``what`` (forkserver, controller, engine): ``nbdist engine 3 (cluster X)``."""
    who = f"nbdist {what}" + (f" {rank}" if rank is not None and rank >= 0 else "")
    return f"{who} ({'cluster ' + cluster if cluster else 'spare'})"


def engine_rank(rank: int, cluster: str) -> None:
    """An engine that named itself (forked locally: one started over SSH or by a scheduler
    keeps ipyparallel's command line) now holds ``rank``: its title says so."""
    if _named is not None and _named.startswith("nbdist engine"):
        name(of("engine", cluster, rank))


def _comm(title: str) -> None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(_PR_SET_NAME, title.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError, TypeError):  # not Linux
        pass
