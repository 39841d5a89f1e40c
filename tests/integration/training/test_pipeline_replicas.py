"""Pipeline replicas on a real 4-engine cluster: 2 stages x 2 replicas, each replica on its own
half of the batch, train exactly as one process on the whole batch, for both schedules, and the
replicas end with identical stages."""

from __future__ import annotations

import numpy as np
import pytest
from clusters import cluster_with
from test_pipeline import MODEL as PIPELINE_MODEL
from test_pipeline import (
    one_process_reference,
)  # one process on the whole batches: the same reference

# the same model and batches as test_pipeline's
MODEL = (
    PIPELINE_MODEL
    + "import torch.distributed as dist\nfrom nbdist.worker.pipeline.stages import pipeline\n"
)

# Replica r trains on rows r*8 .. r*8+7 of each batch: its ranks are given that half.
TRAIN = """
pipe = pipeline(make_model(), split=SPLIT, microbatches=2, loss_fn=F.mse_loss, schedule=SCHEDULE)
opt = torch.optim.SGD(pipe.stage.parameters(), lr=0.1)
rows = 16 // pipe.replicas
losses = []
for x, y in batches():
    part = slice(pipe.replica * rows, (pipe.replica + 1) * rows)
    opt.zero_grad()
    losses.append(pipe.step(x[part], y[part]))
    opt.step()
mine = {k: v.tolist() for k, v in pipe.stage.state_dict().items()}
every = [None] * dist.get_world_size()
dist.all_gather_object(every, (pipe.stage_index, pipe.replica, pipe.replicas, losses, mine))
every
"""


@pytest.fixture(scope="module")
def cluster4():
    """A real 4-engine nbdist cluster, stopped after the module's tests."""
    yield from cluster_with(4, MODEL)


def _check(every, layout, want) -> None:
    want_losses, want_params = want
    assert [tuple(e[:3]) for e in every] == layout
    for e in every:  # the mean over the replicas of each replica's mean: the whole batch's
        np.testing.assert_allclose(e[3], want_losses, rtol=1e-12, atol=1e-12)
    for _, _, _, _, params in every:
        for name, got in params.items():
            np.testing.assert_allclose(
                np.array(got), want_params[name], rtol=1e-10, atol=1e-12, err_msg=name
            )
    stages = {}
    for stage, _, _, _, params in every:  # the replicas hold identical stages, bit for bit
        assert stages.setdefault(stage, params) == params
    assert sorted(k for p in stages.values() for k in p) == sorted(want_params)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_two_stage_two_replicas_train_as_one_process(cluster4, schedule):
    every = cluster4.run(f"SPLIT, SCHEDULE = ['2'], {schedule!r}\n" + TRAIN)
    _check(every, [(0, 0, 2), (1, 0, 2), (0, 1, 2), (1, 1, 2)], one_process_reference())
    shown = [(r["stage"], r["replica"]) for r in cluster4.status()]  # %nbdist status's columns
    assert shown == [("0/2", "0/2"), ("1/2", "0/2"), ("0/2", "1/2"), ("1/2", "1/2")]


def test_one_stage_four_replicas_is_data_parallel(cluster4):
    every = cluster4.run("SPLIT, SCHEDULE = [], 'gpipe'\n" + TRAIN)
    _check(every, [(0, r, 4) for r in range(4)], one_process_reference())
