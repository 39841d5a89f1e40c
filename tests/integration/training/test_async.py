"""``prepare(sync="async")`` on real gloo clusters: ranks that never wait for each other.

On 2 ranks: a small regression trains, and between cells every rank holds the service's global
model; a rank made slow (more compute per step) does not slow the other, where DDP makes it
wait; each rank's ``sync`` events carry its staleness; a run stopped mid-way resumes from each
rank's own checkpoint, with the newest checkpointed global model given back to the service bit
for bit; bad combinations are one line. On 3 ranks: one rank's engine is killed mid-cell, the
kernel says so in one line, the others train on to the end of the cell, and the lost rank has a
fresh engine for the next. The service itself: ``tests/unit/test_param_service.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import psutil
import pytest
import torch
from clusters import REGRESSION, cluster_with, watched
from processes import assert_gone

from nbdist.config import CellOptions
from nbdist.errors import DistributedCellError
from nbdist.telemetry.store import RunStore

# Defined on every rank: a small regression task, one batch per step and rank; each rank's
# parameters gathered; the rank's side of async (the ``Exchange``) of a prepared optimizer.
HELPERS = (
    REGRESSION
    + """
import os, signal, time
import torch.distributed as dist

WORK = torch.randn(300, 300)

def everyone(model):
    v = torch.cat([t.detach().reshape(-1) for t in model.parameters()])
    out = [torch.zeros_like(v) for _ in range(dist.get_world_size())]
    dist.all_gather(out, v)
    return torch.stack(out)

def exchange(opt):
    from nbdist.worker.state import engine
    return next(p.sync.exchange for p in engine.training_plans.values()
                if p.sync is not None and p.sync.optimizer is opt)

def train(steps, slow=(), die=None, **options):
    net = make_net()
    model, opt = nbdist.prepare(net, torch.optim.SGD(net.parameters(), lr=0.05), **options)
    x, y = batches(steps, nbdist.rank())
    losses, t0 = [], time.perf_counter()
    for i in range(steps):
        if nbdist.rank() == die and i == steps // 4:
            os.kill(os.getpid(), signal.SIGKILL)
        opt.zero_grad()
        loss = F.mse_loss(model(x[i]), y[i])
        loss.backward()
        for _ in range(40 if nbdist.rank() in slow else 0):  # a slower rank: more compute
            torch.mm(WORK, WORK)
        opt.step()
        losses.append(loss.item())
    return model, opt, losses, time.perf_counter() - t0
"""
)


def _cluster(n: int):
    return cluster_with(n, HELPERS)


def _service_pid(ranks) -> int:
    return ranks.run("exchange(opt).process.pid", CellOptions(ranks=(0,)))


def _synced_to_the_end(counts: dict) -> bool:
    """A rank of ``train(200, ..., sync_every=2)`` that trained on to the end: each of its 100
    syncs sent its change or, one still on its way, skipped it (most do, on a tiny model on 2
    cores; the cell's end may send one more), and some were applied."""
    return 100 <= sum(counts.values()) <= 101 and counts["applied"] >= 5


class TestTwoRanks:
    @pytest.fixture(scope="class")
    def ranks(self):
        services = []
        for c in _cluster(2):
            yield c, services
        assert_gone(services)  # the parameter services left with their clients

    def test_trains_and_every_rank_holds_the_global_model_between_cells(self, ranks):
        c, services = ranks
        c.run("model, opt, losses, _ = train(120, sync='async', sync_every=2)")
        services.append(_service_pid(c))
        losses = c.run("losses")
        first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
        assert last < 0.2 * first, (first, last)
        params, stats, version = c.run(
            "ex = exchange(opt)\neveryone(model), ex.stats(), ex.version"
        )
        assert torch.equal(params[0], params[1])  # both took the global model at this cell
        assert stats["version"] == version and stats["applied"] >= 4
        assert stats["repeated"] == 0 and stats["dropped"] == 0
        glob = c.run("exchange(opt).base")
        assert torch.equal(glob, params[0])  # ...which is the service's

    def test_a_slow_rank_makes_no_one_wait(self, ranks):
        """Rank 1 computes 40 more matrix products a step than rank 0: under async rank 0
        finishes its steps far sooner; under DDP it waits for rank 1 at every step."""
        c, services = ranks
        t_async = c.run(
            "model, opt, losses, t = train(40, slow=(1,), sync='async', sync_every=2)\nt"
        )
        services.append(_service_pid(c))
        slow_t, counts = c.run("t, exchange(opt).counts", CellOptions(ranks=(1,)))
        assert t_async < 0.5 * slow_t, (t_async, slow_t)
        fast = c.run("exchange(opt).counts")
        # every one of a rank's 20 syncs sent its change or, one still on its way, skipped it;
        # the cell's end sends what was left, if anything was
        for n in (fast, counts):
            assert 40 // 2 <= sum(n.values()) <= 40 // 2 + 1, (fast, counts)
        t_ddp = c.run("train(40, slow=(1,))[3]")
        assert t_ddp > 0.7 * slow_t, (t_ddp, slow_t)  # DDP: rank 0 waits for rank 1

    def test_sync_events_carry_the_staleness(self, ranks, tmp_path, no_front_end):
        c, services = ranks
        store = RunStore(tmp_path / "runs.sqlite")
        src = "model, opt, losses, _ = train(30, sync='async', sync_every=1, max_staleness=3)"
        opts = CellOptions()
        mon = watched(c, src, opts, store_at=store)
        c.run(src, opts, watch=mon)
        services.append(_service_pid(c))
        syncs = [e for e in store.events(mon.run_id) if e["kind"] == "sync"]
        assert {e["rank"] for e in syncs} == {0, 1}, syncs  # every rank reports its own
        data = syncs[0]["data"]
        assert 0 <= data["staleness"] <= data["staleness_max"] <= 3
        assert "changes applied (staleness" in syncs[0]["message"]

    def test_a_checkpoint_resumes_each_rank_and_the_global_model_exactly(self, ranks, tmp_path):
        c, services = ranks
        resume = """
net = make_net()
model, opt = nbdist.prepare(net, torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9),
                            sync="async", sync_every=2)
x, y = batches(20, nbdist.rank())
ran, seen = [], None
for step in nbdist.steps(20, every=5, dir=DIR, run="async", model=model, opt=opt):
    ran.append(step)
    if seen is None:  # where this run starts: the global model this rank holds
        seen = (exchange(opt).version, exchange(opt).base.clone())
    if step == 10:  # the checkpoint after 10 steps was just written: what it holds
        saved = (exchange(opt).version, exchange(opt).base.clone())
    if STOP and step == 12:
        break
    opt.zero_grad()
    F.mse_loss(model(x[step]), y[step]).backward()
    opt.step()
"""
        c.run(f"DIR, STOP = {str(tmp_path)!r}, True\n{resume}")
        services.append(_service_pid(c))
        saved = [c.run("saved", CellOptions(ranks=(r,))) for r in (0, 1)]
        c.run(f"STOP = False\n{resume}", CellOptions(resume=True))
        services.append(_service_pid(c))
        newest = max(saved, key=lambda s: s[0])
        for r in (0, 1):
            ran, (version, glob) = c.run("ran, seen", CellOptions(ranks=(r,)))
            assert ran[0] == 10 and ran[-1] == 19
            assert version == newest[0] and torch.equal(glob, newest[1])
        assert sorted(p.name for p in tmp_path.iterdir()) == ["async.rank0", "async.rank1"]

    def test_a_service_gone_is_one_line_not_a_broken_engine(self, ranks, capsys):
        c, services = ranks
        c.run("model, opt, losses, _ = train(10, sync='async', sync_every=2)")
        pid = _service_pid(c)
        services.append(pid)
        os.kill(pid, signal.SIGKILL)
        assert_gone([pid])
        capsys.readouterr()
        msg = c.run(
            "x, y = batches(1, 0)\nF.mse_loss(model(x[0]), y[0]).backward()\n"
            "try:\n    opt.step(); opt.step()\n    msg = None\n"
            "except nbdist.UsageError as e:\n    msg = str(e)\nmsg"
        )
        said = capsys.readouterr()
        assert "parameter service cannot be reached" in said.out + said.err  # at the cell's start
        assert msg is not None and "prepare the model and its optimizer again" in msg, msg
        assert "\n" not in msg
        assert c.run("1 + 1") == 2  # the engines work on

    def test_a_service_that_cannot_start_is_one_line_on_every_rank(self, ranks):
        """Rank 0's start fails (injected: the service's process cannot be spawned); no rank
        hangs in the broadcast of its address, each says why in one line."""
        c, _ = ranks
        src = (
            "from nbdist.worker.train import asynchronous\n"
            "real = asynchronous.start_service\n"
            "def refused(*a):\n    raise OSError('no python there')\n"
            "asynchronous.start_service = refused\n"
            "try:\n    train(2, sync='async', sync_every=1)\n    msg = None\n"
            "except nbdist.UsageError as e:\n    msg = str(e)\n"
            "finally:\n    asynchronous.start_service = real\n"
        )
        c.run(src)
        for r in (0, 1):
            msg = c.run("msg", CellOptions(ranks=(r,)))
            assert msg is not None and "could not start the parameter service" in msg, msg
            assert "\n" not in msg
        assert "no python there" in c.run("msg")  # rank 0 names the cause

    def test_a_pipeline_stage_is_one_line(self, ranks):
        c, _ = ranks
        msg = c.run(
            "pipe = nbdist.pipeline(make_net(), split=['2'], microbatches=2, loss_fn=F.mse_loss)\n"
            "try:\n    nbdist.prepare(pipe.stage, torch.optim.SGD(pipe.stage.parameters(), "
            "lr=0.1), sync='async', sync_every=2)\n    msg = None\n"
            "except nbdist.UsageError as e:\n    msg = str(e)\nmsg"
        )
        assert msg is not None and "a pipeline's stage is part of one" in msg and "\n" not in msg

    @pytest.mark.parametrize(
        "call, words",
        [
            ("sync='async'", "sync='async' needs sync_every=H"),
            ("sync='async', sync_every=2, strategy='fsdp'", "works with strategy='ddp' only"),
            ("sync='async', sync_every=2, precision='fp16'", "use precision='bf16'"),
            ("sync='async', sync_every=2, compress='powersgd'", "drop compress='powersgd'"),
            ("sync='async', sync_every=2, compress='fp16'", "drop compress='fp16'"),
            ("sync='async', sync_every=2, mesh=nbdist.mesh(dp=2)", "prepare without mesh="),
            ("sync='async', sync_every=2, max_staleness=-1", "max_staleness must be a whole"),
            ("sync='local_sgd', sync_every=2, max_staleness=4", "max_staleness= is sync='async"),
        ],
    )
    def test_bad_combinations_are_one_line(self, ranks, call, words):
        c, _ = ranks
        msg = c.run(
            "net = make_net()\n"
            f"try:\n    nbdist.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1), {call})\n"
            "    msg = None\nexcept nbdist.UsageError as e:\n    msg = str(e)\nmsg"
        )
        assert msg is not None and words in msg and "\n" not in msg, msg


class TestAKilledRank:
    @pytest.fixture(scope="class")
    def ranks(self):
        yield from _cluster(3)

    def test_the_others_train_on_to_the_end_of_the_cell(self, ranks, capsys):
        c = ranks
        before = {s.rank: s.pid for s in c.slots}
        t0 = time.monotonic()
        losses = c.run(
            "model, opt, losses, _ = train(200, die=1, sync='async', sync_every=2)\nlosses"
        )
        said = capsys.readouterr().out
        assert len(losses) == 200 and sum(losses[-10:]) < 0.2 * sum(losses[:10])
        lost = [ln for ln in said.splitlines() if "trains on without it" in ln]
        assert len(lost) == 1 and lost[0].startswith(
            "nbdist: rank 1 lost: engine process killed"
        ), said
        assert time.monotonic() - t0 < 120
        service = _service_pid(c)
        counts = [c.run("exchange(opt).counts", CellOptions(ranks=(r,))) for r in (0, 2)]
        assert all(_synced_to_the_end(n) for n in counts), counts  # both trained on
        after = {s.rank: s.pid for s in c.slots}
        assert after[1] != before[1] and after[0] == before[0]  # a fresh engine for rank 1
        assert c.run("import torch.distributed as dist\ndist.get_world_size()") == 3
        c.stop()
        assert_gone([service])


def test_a_later_ddp_cell_is_not_taken_to_outlive_a_lost_rank(capsys):
    """An async model left behind (held in a list; or a name rebound, until the garbage
    collector runs) by a later ``prepare()`` of DDP: a rank lost in a DDP cell ends the cell as
    a loss; it is not said to train on without it (the DDP peers would wait on it)."""
    ranks = cluster_with(2, HELPERS)
    with contextlib.closing(ranks):
        c = next(ranks)
        c.run("model, opt, losses, _ = train(20, sync='async', sync_every=2)")
        c.run(
            "kept = [model, opt]\nnet = make_net()\n"
            "model, opt = nbdist.prepare(net, torch.optim.SGD(net.parameters(), lr=0.05))"
        )
        capsys.readouterr()
        with pytest.raises(DistributedCellError, match="rank 1") as failed:
            c.run(
                "x, y = batches(200, nbdist.rank())\nfor i in range(200):\n"
                "    if i == 20 and nbdist.rank() == 1:\n"
                "        os.kill(os.getpid(), signal.SIGKILL)\n"
                "    if i == 20 and nbdist.rank() == 0:  # computing, not in a collective\n"
                "        time.sleep(3)\n"
                "    opt.zero_grad()\n    F.mse_loss(model(x[i]), y[i]).backward()\n"
                "    opt.step()\n"
            )
        said = capsys.readouterr().out
        assert "trains on without it" not in said, said
        assert any(f.kind == "died" and f.rank == 1 for f in failed.value.failures)
        assert c.run("import torch.distributed as dist\ndist.get_world_size()") == 2


def test_rank_0_may_die_too(capsys):
    """The parameter service is a process of its own: rank 0's engine dies, the service and the
    others train on; the cell's value (rank 0's) is None, said in one line."""
    ranks = cluster_with(3, HELPERS)
    with contextlib.closing(ranks):  # stopped however the test ends
        c = next(ranks)
        value = c.run("model, opt, losses, _ = train(200, die=0, sync='async', sync_every=2)\n1")
        said = capsys.readouterr().out
        assert value is None
        assert "nbdist: rank 0 lost: engine process killed" in said, said
        done = [c.run("len(losses), exchange(opt).counts", CellOptions(ranks=(r,))) for r in (1, 2)]
        assert all(n == 200 and _synced_to_the_end(counts) for n, counts in done), done
        port = c.run("exchange(opt).link.sock.getpeername()[1]", CellOptions(ranks=(1,)))
        listening = [k for k in psutil.net_connections("tcp") if k.status == psutil.CONN_LISTEN]
        service = next(k.pid for k in listening if k.laddr.port == port)
        assert "nbdist.launch.params" in " ".join(psutil.Process(service).cmdline())
    assert_gone([service])  # it left with the last of its clients, its starter long dead
