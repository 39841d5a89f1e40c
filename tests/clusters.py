"""Real clusters for the tests, and what watches their runs: ``cluster_with(n, source)`` (a
cluster of ``n`` engines with ``source`` run on every rank, stopped and checked gone after),
``REGRESSION`` (a small task for tests of how ranks sync), ``logged_steps`` (the steps a cell
wrote to its log), and ``watched`` (the watch ``%%distributed`` gives a cell) with its board and
its run store."""

from __future__ import annotations

from pathlib import Path

from processes import assert_gone

#: A small regression task for tests of how ranks sync, run on every rank: ``make_net()`` the same
#: small MLP on every rank, ``batches(steps, rank)`` each rank's own batches of 8 samples, one
#: per step, of ``y = sum(x) + noise``.
REGRESSION = """
import torch, torch.nn as nn, torch.nn.functional as F

def make_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

def batches(steps, rank, b=8):
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(steps, b, 8, generator=g)
    return x, x.sum(-1, keepdim=True) + 0.1 * torch.randn(steps, b, 1, generator=g)
"""


def cluster_with(n: int, source: str | None = None):
    """A real cluster of ``n`` engines with ``source`` (if any) run on every rank (a generator,
    for a fixture or ``contextlib.closing``: yields it, then stops it and checks that its engines
    are gone)."""
    import nbdist

    c = nbdist.start(n=n)
    pids = [p.pid for p in c.engines.processes()]
    try:
        if source is not None:
            c.run(source)
        yield c
    finally:  # also when the generator is closed early (a test that failed)
        c.stop()
        assert_gone(pids)


def logged_steps(log: Path) -> list[int]:
    """The steps a training cell wrote to the file ``log``, one a line (none if it wrote none)."""
    return [int(s) for s in log.read_text().split()] if log.exists() else []


def watched(cluster, source: str, opts=None, **kw):
    """The watch ``%%distributed`` gives ``source`` on ``cluster`` (the run store, the board,
    what ``opts`` asks for; ``kw``: ``assemble``'s, such as ``cfg``, ``store_at``, ``extra``):
    hand it to ``cluster.run(..., watch=)``, which closes it at the run's end."""
    from nbdist.config import CellOptions
    from nbdist.notebook.run.observers.assembly import assemble

    ranks = [s.rank for s in cluster.slots]
    return assemble(source, opts or CellOptions(), ranks, **kw)


def board_of(watch):
    """The live dashboard's observer of a watched run (``.dashboard``, ``.latencies``)."""
    from nbdist.notebook.run.observers.dashboard import Board

    return watch.find(Board)


def store_of(watch):
    """The run store a watched run is kept in."""
    from nbdist.notebook.run.observers.store import RunRecord

    return watch.find(RunRecord).writer.store
