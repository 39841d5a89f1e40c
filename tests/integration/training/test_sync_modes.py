"""``prepare(sync="local_sgd" | "diloco")`` on a real 2-rank gloo cluster.

Ranks differ between syncs and hold the same bits right after one; the results equal references
computed here, in the test process, from the same data (each rank's own SGD steps, then the mean,
or DiLoCo's outer Nesterov step); the warm-up is synchronous; fp16 compression composes; every
sync is an event with the ranks' drift in the run store; a run killed mid-window and recovered
from its checkpoint ends with the uninterrupted run's parameters, bit for bit.
"""

from __future__ import annotations

import pytest
import torch
from clusters import REGRESSION, watched
from processes import assert_gone, kill_when

from nbdist.config import CellOptions
from nbdist.telemetry.store import RunStore

WORLD, LR = 2, 0.05

# Defined on every rank and here: a small regression task, one batch per step and rank.
HELPERS = (
    REGRESSION
    + """

def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])
"""
)

# On the ranks: train with ``prepare(**options)``, and after every step record whether all
# ranks hold the same bits. Returns (equal after each step, rank 0's parameters).
TRAIN = f"""
import torch.distributed as dist

def train(steps, use_train_step=False, **options):
    net = make_net()
    model, opt = nbdist.prepare(net, torch.optim.SGD(net.parameters(), lr={LR}), **options)
    x, y = batches(steps, nbdist.rank())
    same = []
    for i in range(steps):
        if use_train_step:
            with nbdist.train_step(model, opt) as step:
                step.backward(F.mse_loss(model(x[i]), y[i]))
        else:
            opt.zero_grad()
            F.mse_loss(model(x[i]), y[i]).backward()
            opt.step()
        v = flat(model)
        out = [torch.zeros_like(v) for _ in range(dist.get_world_size())]
        dist.all_gather(out, v)
        same.append(all(torch.equal(out[0], o) for o in out))
    return same, flat(model)
"""

exec(HELPERS)  # the same helpers here, for the references


def reference(mode, steps, every, warmup=0, outer_lr=0.7, outer_momentum=0.9):
    """What the ranks should end with, simulated here: rank 0's flat parameters."""
    import torch.nn.functional as F
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    nets = [make_net() for _ in range(WORLD)]  # noqa: F821 (from HELPERS)
    opts = [torch.optim.SGD(n.parameters(), lr=LR) for n in nets]
    data = [batches(steps, r) for r in range(WORLD)]  # noqa: F821
    glob = mom = None
    for i in range(steps):
        if i == warmup:  # the first local step: the global parameters are the current ones
            glob = parameters_to_vector(nets[0].parameters()).detach().clone()
            mom = torch.zeros_like(glob)
        for n, (x, y) in zip(nets, data, strict=True):
            n.zero_grad()
            F.mse_loss(n(x[i]), y[i]).backward()
        if i < warmup:  # synchronous: every rank steps on the mean gradient
            for ps in zip(*(n.parameters() for n in nets), strict=True):
                mean = sum(p.grad for p in ps) / WORLD
                for p in ps:
                    p.grad = mean.clone()
        for o in opts:
            o.step()
        done = i + 1 - warmup
        if done > 0 and done % every == 0:
            local = torch.stack([parameters_to_vector(n.parameters()).detach() for n in nets])
            if mode == "local_sgd":
                new = local.mean(0)
            else:
                delta = glob - local.mean(0)
                mom = outer_momentum * mom + delta
                glob = glob - outer_lr * (delta + outer_momentum * mom)
                new = glob
            for n in nets:
                vector_to_parameters(new.clone(), n.parameters())
    return parameters_to_vector(nets[0].parameters()).detach()


@pytest.fixture(scope="module")
def ranks(cluster):
    cluster.run(HELPERS + TRAIN)
    return cluster


def _syncs_after(steps: int, every: int, warmup: int = 0) -> list[bool]:
    """After which steps the ranks agree: the warm-up's, and every ``every``-th one after."""
    return [i < warmup or (i + 1 - warmup) % every == 0 for i in range(steps)]


@pytest.mark.parametrize(
    "options",
    [
        {"sync": "local_sgd"},
        {"sync": "diloco"},
        {"sync": "local_sgd", "compress": "fp16"},
        {"sync": "diloco", "compress": "fp16"},
        {"sync": "local_sgd", "sync_warmup": 3},
        {"sync": "diloco", "sync_warmup": 3, "outer_lr": 0.5, "outer_momentum": 0.5},
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()),
)
def test_ranks_differ_between_syncs_and_match_the_reference(ranks, options):
    steps, every = 11, 4
    same, params = ranks.run(f"train({steps}, sync_every={every}, **{options!r})")
    warmup = options.get("sync_warmup", 0)
    assert same == _syncs_after(steps, every, warmup)
    outer = {k: options[k] for k in ("outer_lr", "outer_momentum") if k in options}
    ref = reference(options["sync"], steps, every, warmup, **outer)
    err = (params - ref).abs().max().item()
    moved = (ref - flat(make_net())).abs().max().item()  # noqa: F821
    assert moved > 1e-2
    tolerance = 1e-3 if "compress" in options else 1e-6  # fp16 differences; float order
    assert err < tolerance, err


def test_train_step_and_accumulation_drive_it_unchanged(ranks):
    """``train_step`` with accumulate=2: a sync every 2 optimizer steps = 4 micro-steps."""
    same, _ = ranks.run("train(8, use_train_step=True, sync='local_sgd', sync_every=2, "
                        "accumulate=2)")  # fmt: skip
    # optimizer steps after micro-steps 2, 4, 6, 8; syncs after 4 and 8; nothing moves on odd ones
    assert same == [True, False, False, True] * 2


def test_no_gradient_all_reduce_between_syncs(ranks):
    """Past the warm-up DDP's hook sends nothing: one more gloo call per sync only."""
    n = ranks.run(
        """
import torch.distributed as dist
calls = []
real = dist.all_reduce
dist.all_reduce = lambda *a, **k: (calls.append(1), real(*a, **k))[1]
try:
    train(6, sync="diloco", sync_every=3, sync_warmup=2)
finally:
    dist.all_reduce = real
len(calls)
"""
    )
    # train()'s own check is an all_gather; 2 warm-up steps each all-reduce their one bucket
    # (through DDP's hook, which calls dist.all_reduce), then 1 sync in 4 local steps of 3:
    # its drift sample, its deltas, its buffers (none here: skipped)
    assert n == 2 + 2


def test_sync_events_carry_the_drift(ranks, tmp_path, no_front_end):
    store = RunStore(tmp_path / "runs.sqlite")
    src = "train(9, sync='diloco', sync_every=3)"
    opts = CellOptions()
    mon = watched(ranks, src, opts, store_at=store)
    ranks.run(src, opts, watch=mon)
    syncs = [e for e in store.events(mon.run_id) if e["kind"] == "sync"]
    assert syncs, store.events(mon.run_id)
    first = syncs[0]
    assert first["rank"] == 0 and first["data"]["step"] == 3 and first["data"]["drift"] > 0
    assert "ranks drifted" in first["message"]
    assert sum(e["data"]["syncs"] for e in syncs) <= 3
    assert 0 <= first["data"]["drift_s"] <= first["data"]["sync_s"]
    assert any(e.kind == "sync" for e in mon.events)  # what the dashboard lists


@pytest.mark.parametrize(
    "call, words",
    [
        (
            "sync='gosip', sync_every=2",
            "sync must be one of ('ddp', 'local_sgd', 'diloco', 'gossip', 'async')",
        ),
        ("sync='local_sgd'", "needs sync_every=H"),
        ("sync='local_sgd', sync_every=0", "sync_every must be a whole number >= 1"),
        ("sync='local_sgd', sync_every=2.0", "sync_every must be a whole number >= 1"),
        ("sync='diloco', sync_every=2, sync_warmup=-1", "sync_warmup must be a whole number"),
        ("sync='diloco', sync_every=2, outer_lr=0", "outer_lr must be a number in (0, inf)"),
        ("sync='diloco', sync_every=2, outer_momentum=1", "outer_momentum must be a number in"),
        ("sync='diloco', sync_every=2, outer_lr=float('nan')", "outer_lr must be a number"),
        ("sync='local_sgd', sync_every=2, outer_lr=0.5", "outer_lr and outer_momentum are Di"),
        ("sync_every=4", "sync_every and sync_warmup apply to sync='local_sgd', 'diloco'"),
        ("sync='local_sgd', sync_every=2, strategy='fsdp'", "works with strategy='ddp' only"),
        ("sync='diloco', sync_every=2, compress='powersgd'", "use compress='fp16' or 'bf16'"),
        ("sync='diloco', sync_every=2, precision='fp16'", "use precision='bf16'"),
    ],
)
def test_bad_options_are_one_line(ranks, call, words):
    msg = ranks.run(
        "net = make_net()\n"
        f"try:\n    nbdist.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1), {call})\n"
        "    msg = None\nexcept nbdist.UsageError as e:\n    msg = str(e)\nmsg"
    )
    assert msg is not None and words in msg and "\n" not in msg, msg


def test_diloco_needs_the_optimizer(ranks):
    msg = ranks.run(
        "try:\n    nbdist.prepare(make_net(), sync='diloco', sync_every=2)\n    msg = None\n"
        "except nbdist.UsageError as e:\n    msg = str(e)\nmsg"
    )
    assert msg == "sync='diloco' needs the optimizer: prepare(model, opt, sync='diloco')"


# -- recovery: rank 1 is SIGKILLed mid-window; the run resumes from its checkpoint -------------

STEPS, EVERY, KILL_AT = 24, 5, 12  # checkpoints after steps 4, 9, ...: 10 steps done is mid-window
RECOVER = f"""
import os, threading
net = make_net()
inner = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)  # per-rank momentum
model, opt = nbdist.prepare(net, inner, sync=MODE, sync_every=4, sync_warmup=1)
x, y = batches({STEPS}, nbdist.rank())
for step in nbdist.steps({STEPS}, every={EVERY}, dir=DIR, model=model, opt=opt):
    if KILL and nbdist.rank() == 1 and step == {KILL_AT} and not os.path.exists(KILL):
        open(KILL, "w").close()
        threading.Event().wait()  # until the test kills this engine
    opt.zero_grad()
    F.mse_loss(model(x[step]), y[step]).backward()
    opt.step()
flat(model)
"""


@pytest.mark.parametrize("mode", ["diloco", "gossip"])
def test_recovers_from_a_killed_rank_exactly(ranks, tmp_path, mode):
    ranks.run(f"DIR, KILL, MODE = {str(tmp_path / 'ref')!r}, None, {mode!r}")
    expected = ranks.run(RECOVER)
    kill = tmp_path / "rank1-waits"
    ranks.run(f"DIR, KILL = {str(tmp_path / 'run')!r}, {str(kill)!r}")
    victim = ranks.slots[1].pid
    killed = kill_when(kill, victim)
    params = ranks.run(RECOVER, CellOptions(restarts=1))
    assert killed.is_set() and ranks.slots[1].pid != victim
    assert torch.equal(params, expected)
    assert_gone([victim])
