"""``prepare(sync="gossip")`` on real 2-, 3- and 4-rank gloo clusters (one at a time).

One sync's mixing equals, bit for bit, what is computed here from every rank's parameters and
buffers before it (the ring's mean of a rank and its neighbours, which on 4 ranks leaves one
out; the pair's mean on 2 ranks); a sync moves parameters point to point only (the one
all-reduce is the drift's sample, at every ``DRIFT_EVERY``-th sync); a small regression trains,
with the ranks kept close; rank 0 reports the drift as a ``sync`` event; a run stopped
mid-window resumes from its checkpoint to the uninterrupted run's parameters on every rank,
bit for bit; bad combinations are one line.
"""

from __future__ import annotations

import pytest
import torch
from clusters import REGRESSION, cluster_with, watched

from nbdist.config import CellOptions
from nbdist.telemetry.store import RunStore
from nbdist.worker.train.gossip import DRIFT_EVERY

# Defined on every rank: a small regression task with a BatchNorm (floating buffers are mixed
# too), one batch per step and rank, and each rank's parameters and buffers gathered.
HELPERS = (
    REGRESSION
    + """
import torch.distributed as dist

def make_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))

def tensors(model):
    return [*model.parameters(), *(b for b in model.buffers() if b.dtype.is_floating_point)]

def everyone(model):
    v = torch.cat([t.detach().reshape(-1) for t in tensors(model)])
    out = [torch.zeros_like(v) for _ in range(dist.get_world_size())]
    dist.all_gather(out, v)
    return torch.stack(out)

def train(steps, **options):
    net = make_net()
    model, opt = nbdist.prepare(net, torch.optim.SGD(net.parameters(), lr=0.05), **options)
    x, y = batches(steps, nbdist.rank())
    losses = []
    for i in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(model(x[i]), y[i])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, everyone(model)
"""
)

# On the ranks: every rank's own random parameters and buffers, then one optimizer step with no
# gradients (SGD leaves them as they are), after which the sync mixes them.
MIX = """
net = make_net()
model, opt = nbdist.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1), sync="gossip",
                            sync_every=1)
g = torch.Generator().manual_seed(7 + nbdist.rank())
with torch.no_grad():
    for t in tensors(model):
        t.copy_(torch.randn(t.shape, generator=g))
before = everyone(model)
opt.step()
before, everyone(model)
"""


def _cluster(n: int):
    return cluster_with(n, HELPERS)


def expected_mix(before: torch.Tensor) -> torch.Tensor:
    """Each rank's tensors after one sync, in the order gossip adds them (left, own, right)."""
    n = len(before)
    if n == 2:
        return torch.stack([before[r] + before[1 - r] for r in range(2)]) / 2
    return torch.stack([(before[r - 1] + before[r] + before[(r + 1) % n]) / 3 for r in range(n)])


# -- checkpoints: a run stopped mid-window resumes exactly ---------------------------------------

STEPS, EVERY, STOP_AT = 20, 5, 12  # checkpoints after 5, 10, ... steps; 10 is mid-window (9..13)
RESUME = f"""
net = make_net()
inner = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)  # per-rank momentum
model, opt = nbdist.prepare(net, inner, sync="gossip", sync_every=4, sync_warmup=1)
x, y = batches({STEPS}, nbdist.rank())
ran = []
for step in nbdist.steps({STEPS}, every={EVERY}, dir=DIR, run="gossip", model=model, opt=opt):
    ran.append(step)
    if STOP and step == {STOP_AT}:
        break
    opt.zero_grad()
    F.mse_loss(model(x[step]), y[step]).backward()
    opt.step()
ran[0], everyone(model)
"""


# On the ranks: gossip asked for a pipeline's stage.
PIPELINE = """
pipe = nbdist.pipeline(make_net(), split=["2"], microbatches=2, loss_fn=F.mse_loss)
try:
    nbdist.prepare(pipe.stage, torch.optim.SGD(pipe.stage.parameters(), lr=0.1),
                   sync="gossip", sync_every=2)
    msg = None
except nbdist.UsageError as e:
    msg = str(e)
msg
"""


# On the ranks: 12 gossip syncs, every all-reduce's size and every batch of P2P ops recorded.
COUNTED = """
calls, p2p = [], []
real_reduce, real_batch = dist.all_reduce, dist.batch_isend_irecv
def counted_reduce(t, *a, **k):
    calls.append(t.numel())
    return real_reduce(t, *a, **k)
def counted_batch(ops):
    p2p.append(sorted((op.op.__name__, op.peer, op.tensor.numel()) for op in ops))
    return real_batch(ops)
dist.all_reduce, dist.batch_isend_irecv = counted_reduce, counted_batch
try:
    train(12, sync="gossip", sync_every=1)
finally:
    dist.all_reduce, dist.batch_isend_irecv = real_reduce, real_batch
calls, p2p, sum(t.numel() for t in tensors(make_net()))
"""


class TestTwoRanks:
    """The pair's mean, the drift's event, and what does not go with gossip."""

    @pytest.fixture(scope="class")
    def ranks(self):
        yield from _cluster(2)

    def test_one_sync_takes_the_pair_mean_exactly(self, ranks):
        before, after = ranks.run(MIX)
        assert not torch.equal(before[0], before[1])
        assert torch.equal(after, expected_mix(before))
        assert torch.equal(after[0], after[1])  # a + b == b + a in floating point too

    def test_sync_events_carry_the_drift(self, ranks, tmp_path, no_front_end):
        store = RunStore(tmp_path / "runs.sqlite")
        src = "train(12, sync='gossip', sync_every=1)"
        opts = CellOptions()
        mon = watched(ranks, src, opts, store_at=store)
        ranks.run(src, opts, watch=mon)
        syncs = [e for e in store.events(mon.run_id) if e["kind"] == "sync"]
        assert syncs, store.events(mon.run_id)
        first = syncs[0]
        assert first["rank"] == 0 and first["data"]["step"] == 1 and first["data"]["drift"] > 0
        assert first["message"].startswith("gossip sync 1 after step 1: ranks drifted")
        assert f"measured at every {DRIFT_EVERY}th sync" in first["message"]
        assert 0 <= first["data"]["drift_s"] <= first["data"]["sync_s"]
        assert any(e.kind == "sync" for e in mon.events)  # what the dashboard lists

    @pytest.mark.parametrize(
        "call, words",
        [
            ("sync='gossip'", "sync='gossip' needs sync_every=H"),
            ("sync='gossip', sync_every=2, topology='torus'", "topology must be one of ('ring',)"),
            ("sync='local_sgd', sync_every=2, topology='ring'", "topology= is gossip's"),
            ("sync='gossip', sync_every=2, strategy='fsdp'", "works with strategy='ddp' only"),
            ("sync='gossip', sync_every=2, precision='fp16'", "use precision='bf16'"),
            ("sync='gossip', sync_every=2, compress='powersgd'", "drop compress='powersgd'"),
            ("sync='gossip', sync_every=2, compress='bf16'", "drop compress='bf16'"),
            ("sync='gossip', sync_every=2, mesh=nbdist.mesh(dp=2)", "prepare without mesh="),
            ("sync='gossip', sync_every=2, outer_lr=0.5", "outer_lr and outer_momentum are Di"),
        ],
    )
    def test_bad_combinations_are_one_line(self, ranks, call, words):
        msg = ranks.run(
            "net = make_net()\n"
            f"try:\n    nbdist.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1), {call})\n"
            "    msg = None\nexcept nbdist.UsageError as e:\n    msg = str(e)\nmsg"
        )
        assert msg is not None and words in msg and "\n" not in msg, msg

    def test_a_pipeline_stage_is_one_line(self, ranks):
        msg = ranks.run(PIPELINE)
        assert msg is not None and "a pipeline's stage is part of one" in msg and "\n" not in msg


class TestThreeRanks:
    """The ring's mean, point to point; training; checkpoints."""

    @pytest.fixture(scope="class")
    def ranks(self):
        yield from _cluster(3)

    def test_one_sync_takes_the_ring_mean_exactly(self, ranks):
        before, after = ranks.run(MIX)
        assert torch.equal(after, expected_mix(before))
        # the ring's matrix is doubly stochastic: the ranks' mean stays (up to rounding)
        assert (after.mean(0) - before.mean(0)).abs().max() < 1e-6
        assert (after - after.mean(0)).abs().max() < 1e-5 < (before - before.mean(0)).abs().max()

    def test_parameters_move_point_to_point_only(self, ranks):
        """12 syncs of 3 ranks: 12 batches of sends to and receives from both neighbours, of every
        parameter and floating buffer; the only all-reduces are the drift's, at syncs 1 and 11."""
        calls, p2p, size = ranks.run(COUNTED)
        assert len(calls) == 12 // DRIFT_EVERY + 1 == 2
        assert all(c < 2 * size for c in calls) and len(set(calls)) == 1
        # rank 0's neighbours are ranks 2 and 1
        ring = sorted(
            [("irecv", 1, size), ("irecv", 2, size), ("isend", 1, size), ("isend", 2, size)]
        )
        assert p2p == [ring] * 12

    def test_training_converges_with_the_ranks_close(self, ranks):
        losses, params = ranks.run("train(100, sync='gossip', sync_every=2)")
        first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
        assert last < 0.2 * first, (first, last)
        spread = (params - params.mean(0)).abs().max().item()
        _, alone = ranks.run("train(100, sync='gossip', sync_every=1000)")  # no sync
        apart = (alone - alone.mean(0)).abs().max().item()
        assert spread < 0.2 * apart, (spread, apart)

    def test_a_checkpoint_resumes_every_rank_exactly(self, ranks, tmp_path):
        ranks.run(f"DIR, STOP = {str(tmp_path / 'ref')!r}, False")
        start, expected = ranks.run(RESUME)
        assert start == 0 and not torch.equal(expected[0], expected[1])  # ranks differ
        ranks.run(f"DIR, STOP = {str(tmp_path / 'run')!r}, True")
        start, stopped = ranks.run(RESUME)
        assert start == 0 and not torch.equal(stopped, expected)
        ranks.run("STOP = False")
        start, resumed = ranks.run(RESUME, CellOptions(resume=True))
        assert start == 10  # the checkpoint after 10 steps, between two syncs
        assert torch.equal(resumed, expected)


class TestFourRanks:
    """A ring that is not every rank: each rank's mean leaves out the rank across from it."""

    @pytest.fixture(scope="class")
    def ranks(self):
        yield from _cluster(4)

    def test_one_sync_takes_the_ring_mean_exactly(self, ranks):
        before, after = ranks.run(MIX)
        assert torch.equal(after, expected_mix(before))
        # not the mean over all ranks: rank r's leaves out rank r + 2
        assert (after - before.mean(0)).abs().max() > 1e-2
