"""The fork server: single-threaded when it forks, and the first to know of an engine's death."""

from __future__ import annotations

import os
import signal
import time

import psutil
from conftest import assert_gone

import nbdist


def test_the_fork_server_has_one_thread_and_reports_a_death_at_once():
    """A fork from a multi-threaded process can deadlock the child on a lock another thread
    held (Python 3.12 warns): the server runs one thread, and its loop still learns of a dead
    engine from SIGCHLD within milliseconds."""
    c = nbdist.start(n=1)
    pids = [p.pid for p in c.engines.processes()]
    try:
        server = psutil.Process(c.engines.server_pid)
        assert server.num_threads() == 1, [t.id for t in server.threads()]
        victim = c.slots[0].pid
        t0 = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        death = c.engines.exits.get(timeout=5)
        assert (death.pid, death.status) == (victim, -signal.SIGKILL)
        assert time.monotonic() - t0 < 1.0
        assert server.num_threads() == 1
        # a replacement is forked from the same server, and works
        c.replace([0])
        assert c.run("nbdist.rank()") == 0
    finally:
        c.stop()
    assert_gone(pids)
