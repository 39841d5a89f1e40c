"""Where every rank is when a cell is stopped, in a real kernel on real engines: a rank waiting in
a collective, one asleep in Python, one stuck in C code holding the interpreter (read from
outside by py-spy), and ``%nbdist stacks`` between cells; the error's traceback folds torch's
frames into one line."""

from __future__ import annotations

import shutil

import pytest


def test_a_timeout_shows_where_each_rank_was_folded(ready):
    res = ready.run(
        "%%distributed --timeout 3\n"
        "import time, torch.distributed as dist\n"
        "if nbdist.rank() == 0:\n"
        "    dist.barrier()\n"
        "else:\n"
        "    time.sleep(60)\n"
    )
    assert res.error is not None
    out = res.stdout
    assert "nbdist: the cell ran past --timeout 3 s; where the ranks were:" in out
    block = out.split("where the ranks were:\n", 1)[1]
    rank0, rank1 = block.split("rank 1:\n")
    assert rank0.startswith("rank 0:\n")
    assert "the cell, line 3, in <module>: dist.barrier()" in rank0
    assert "… in torch.distributed" in rank0 and "c10d_logger" not in rank0
    assert "the cell, line 5, in <module>: time.sleep(60)" in rank1
    # the error's traceback: the person's line, torch's wrappers folded into one line
    tb = "\n".join(res.error["traceback"])
    assert "dist.barrier()" in tb and "c10d_logger.py" not in tb


@pytest.mark.skipif(shutil.which("py-spy") is None, reason="py-spy is not installed")
def test_a_rank_stuck_in_c_code_is_read_from_outside(ready):
    res = ready.run(
        "%%distributed --timeout 2\n"
        "import ctypes, time\n"
        "libc, lock = ctypes.PyDLL(None), ctypes.create_string_buffer(64)  # a pthread mutex\n"
        "if nbdist.rank() == 1:\n"
        "    libc.pthread_mutex_lock(lock)\n"
        "    libc.pthread_mutex_lock(lock)  # a deadlock in C, the interpreter held\n"
        "else:\n"
        "    time.sleep(60)\n",
        timeout=180,
    )
    assert res.error is not None
    block = res.stdout.split("where the ranks were:\n", 1)[1]
    rank1 = block.split("rank 1:\n", 1)[1]
    assert "(read by py-spy: the engine was busy in C code)" in rank1
    assert "the cell, line 5, in <module>: libc.pthread_mutex_lock(lock)" in rank1
    report = "\n".join(res.error["traceback"])
    assert "rank(s) [1] got fresh engines" in report  # it would not stop: its engine was killed
    ready.ok("%%distributed\nnbdist.rank()")  # its engine was replaced: the cluster works


def test_stacks_between_cells_show_every_ranks_threads(ready):
    ready.ok(
        "%%distributed\n"
        "import threading, time\n"
        "def load_forever():\n"
        "    while True:\n"
        "        time.sleep(0.05)\n"
        "threading.Thread(target=load_forever, name='loader', daemon=True).start()\n"
    )
    out = ready.ok("%nbdist stacks").stdout
    assert out.startswith("ranks 0, 1:\n"), out  # both in the same place: one block
    assert "  thread loader:\n    cell " in out
    assert "line 4, in load_forever: time.sleep(0.05)" in out
