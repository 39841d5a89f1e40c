"""Sixteen real training ranks on this 2-core machine (``--oversubscribe``): DDP trains on
scattered shards under a watched run (board and run store), is stopped by ``--timeout`` in the
middle, and the next cell trains on from where the stop left it, the replicas equal; the board's
figures and the run store's agree; the stop replaces no rank's engine."""

from __future__ import annotations

import numpy as np
import pytest
from clusters import board_of, store_of, watched
from processes import assert_gone

import nbdist
from nbdist.config import CellOptions
from nbdist.errors import DistributedCellError

RANKS = 16

MODEL = """
import torch, torch.nn.functional as F
torch.manual_seed(0)
model = nbdist.prepare(torch.nn.Sequential(
    torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
steps = 0
"""

TRAIN = """
batches = nbdist.loader("data", batch_size=8)
for _ in range({n}):
    for xb, yb in batches:
        opt.zero_grad()
        loss = F.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
        steps += 1
        nbdist.report(step=steps, loss=loss, samples=len(xb))
"""

STATE = """
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
(steps, flat.sum().item(), flat.norm().item())
"""


@pytest.mark.usefixtures("no_front_end")
def test_sixteen_ranks_train_are_stopped_and_train_on():
    cluster = nbdist.start(n=RANKS, oversubscribe=True, start_timeout=240)
    pids = [p.pid for p in cluster.engines.processes()]
    try:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((RANKS * 32, 8)).astype("float32")
        data = (x, x.sum(1, keepdims=True))  # kept, as a notebook keeps it: a fresh engine gets it
        nbdist.scatter("data", data)
        cluster.run(MODEL)

        source = TRAIN.format(n=2)  # 2 epochs of 4 batches on every rank
        watch = watched(cluster, source, CellOptions())
        cluster.run(source, watch=watch)
        col, store = watch.collector, store_of(watch)
        assert sorted(col.ranks) == list(range(RANKS))
        assert all(st.step == 8 for st in col.ranks.values())
        run = store.get_run(watch.run_id)
        assert run["status"] == "ok" and run["step"] == 8
        assert run["loss"] == pytest.approx(col.series.last("loss"))  # the board's, the store's
        assert {h["rank"]: h["state"] for h in store.health(watch.run_id)} == {
            r: "done" for r in range(RANKS)
        }
        assert board_of(watch) is not None

        engines = [s.pid for s in cluster.slots]
        with pytest.raises(DistributedCellError, match="ran past --timeout") as info:
            cluster.run(TRAIN.format(n=100_000), CellOptions(timeout=4, stop_wait=60))
        before = cluster.run(STATE)
        # every rank keeps its engine: a rank whose own interrupt came as it left the cell (a
        # peer's stop reached it first) answered KeyboardInterrupt from outside the cell, and
        # was counted lost and replaced (ranks 2-15, 1 run in 3 alone; 1-15 in the whole suite)
        fresh = [r for r, s in enumerate(cluster.slots) if s.pid != engines[r]]
        assert not fresh, f"ranks {fresh} replaced by a --timeout stop:\n{info.value.report()}"
        assert before[0] > 8  # the stopped cell trained a while
        cluster.run(TRAIN.format(n=1))
        after = [cluster.run(STATE, CellOptions(ranks=(r,))) for r in (0, 7, RANKS - 1)]
        assert after[0][0] == before[0] + 4 and after[0][1] != before[1]
        assert all(a[1:] == after[0][1:] for a in after), after  # the replicas agree
    finally:
        cluster.stop()
    assert_gone(pids)
