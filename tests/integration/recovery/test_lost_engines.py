"""An engine killed between cells: every call to its rank (pull, gather, scatter, stacks, the
post-mortem) says the same one line; the next cell gives the rank a fresh engine."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from processes import assert_gone, wait_until

import nbdist
from nbdist.config import CellOptions
from nbdist.errors import DistributedCellError, UsageError
from nbdist.notebook.cluster import fanout
from nbdist.notebook.debug import postmortem, stacks


def _one_line(call) -> str:
    with pytest.raises(UsageError) as info:
        call()
    text = str(info.value)
    assert "\n" not in text and info.value._render_traceback_() == [f"UsageError: {text}"]
    return text


def _says_rank_1_is_lost(text: str, pid: int) -> None:
    assert f"rank 1: its engine process killed by SIGKILL (pid {pid})" in text, text
    assert fanout.LOST_FIX in text


def test_a_killed_engine_is_one_line_everywhere_until_the_next_cell_replaces_it():
    c = nbdist.start(n=2)
    pids = [p.pid for p in c.engines.processes()]
    try:
        c.run("x = nbdist.rank() + 10\nimport numpy as np\ny = np.arange(3) + nbdist.rank()")
        with pytest.raises(DistributedCellError):  # a failure to look at, on rank 1
            c.run("if nbdist.rank() == 1:\n    raise ValueError('to look at')")
        victim = c.slots[1].pid
        os.kill(victim, signal.SIGKILL)
        # at once, before anything knows of the death: the call meets it, and says so
        _says_rank_1_is_lost(_one_line(lambda: c.pull("x", 1)), victim)
        wait_until(lambda: c.status()[1]["state"] == "lost", 10, what="rank 1 to show lost")
        assert c.status()[0]["state"] == "ready"
        assert c.pull("x", 0) == 10  # the live rank answers as before

        _says_rank_1_is_lost(_one_line(lambda: c.pull("x", 1)), victim)
        _says_rank_1_is_lost(_one_line(lambda: nbdist.gather("y")), victim)
        _says_rank_1_is_lost(_one_line(lambda: nbdist.scatter("z", np.zeros((4, 2)))), victim)
        got = stacks.between_cells(c)
        _says_rank_1_is_lost(f"rank 1: {got[1]}", victim)
        assert not isinstance(got[0], str)  # rank 0's stacks, read from its engine
        _says_rank_1_is_lost(_one_line(lambda: postmortem.post_mortem(c, 1)), victim)

        # the next cell replaces it, and --restarts replays what earlier cells defined
        c.run("pass", CellOptions(restarts=1, grace=0.5, stop_wait=1.0))
        assert c.slots[1].pid != victim and c.status()[1]["state"] == "ready"
        assert c.pull("x", 1) == 11
        assert_gone([victim])
    finally:
        c.stop()
    assert_gone(pids)


def test_cells_and_calls_leave_no_records_in_the_client(cluster):
    """ipyparallel's client keeps every call's id in its history, for good: the ids of calls
    that ended are dropped, so a kernel's client does not grow with its cells and calls."""
    client = cluster.client

    def kept() -> tuple[int, int, int]:
        return len(client.history), len(client.results), len(client.metadata)

    for _ in range(3):
        cluster.run("print('a line'); v = 1")
        cluster.pull("v", 0)
    before = kept()
    for _ in range(40):
        cluster.run("print('a line'); v = 1")
        cluster.pull("v", 1)
        cluster.status()
    # a call returns at its reply; its record goes at the engine's "idle" a moment later
    wait_until(lambda: kept() <= before, 10, what=f"the records to drain: {kept()} > {before}")
    assert len(client.history) <= len(cluster.slots)
