"""``nbdist.prepare`` options and ``nbdist.train_step``, checked on a real 2-rank gloo cluster."""

from __future__ import annotations

import pytest

from nbdist.errors import DistributedCellError

# Helpers defined on every rank once: a small regression task, a training loop that uses
# train_step, and the model's parameters as one vector (FSDP shards gathered).
_HELPERS = """
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist

def make_net(width=16):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 1))

def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return x, x.sum(1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g)

def flat(model):
    ps = [p.detach() for p in model.parameters()]
    ps = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in ps]
    return torch.cat([p.reshape(-1).float() for p in ps])

def equal_on_all_ranks(model):
    v = flat(model)
    out = [torch.zeros_like(v) for _ in range(dist.get_world_size())]
    dist.all_gather(out, v)
    return all(torch.equal(out[0], o) for o in out)

def train(steps=40, micro_batch=16, **options):
    net = make_net()
    model, opt = nbdist.prepare(net, torch.optim.SGD(net.parameters(), lr=0.05), **options)
    x, y = data(micro_batch * steps, seed=1 + nbdist.rank())
    losses = []
    for i in range(steps):
        xb, yb = x[i * micro_batch:(i + 1) * micro_batch], y[i * micro_batch:(i + 1) * micro_batch]
        with nbdist.train_step(model, opt) as step:
            loss = F.mse_loss(model(xb), yb)
            step.backward(loss)
        losses.append(loss.item())
    return model, losses
"""


@pytest.fixture(scope="module")
def ranks(cluster):
    cluster.run(_HELPERS)
    return cluster


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"static_graph": True},
        {"precision": "bf16"},
        {"compress": "fp16"},
        {"compress": "bf16"},
        {"compress": "powersgd", "powersgd_rank": 1, "powersgd_warmup": 2},
        {"accumulate": 4},
        {"accumulate": 2, "static_graph": True, "compress": "fp16"},
        {"strategy": "fsdp"},
        {"strategy": "fsdp", "precision": "bf16", "accumulate": 2},
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "defaults",
)
def test_loss_goes_down_and_ranks_agree(ranks, options):
    first, last, same = ranks.run(
        f"model, losses = train(**{options!r})\n"
        "(sum(losses[:4]) / 4, sum(losses[-4:]) / 4, equal_on_all_ranks(model))"
    )
    assert last < 0.5 * first, (first, last)
    assert same, "parameters differ between ranks after training"


@pytest.mark.parametrize("extra", [{}, {"static_graph": True}, {"strategy": "fsdp"}],
                         ids=["ddp", "static_graph", "fsdp"])  # fmt: skip
def test_accumulation_matches_one_big_batch(ranks, extra):
    """k micro-batches with accumulate=k give the parameters of one step on the k-times batch."""
    diff = ranks.run(
        f"""
k, b = 4, 8
x, y = data(2 * k * b, seed=10 + nbdist.rank())
net, big_net = make_net(), make_net()
sgd = lambda m: torch.optim.SGD(m.parameters(), lr=0.1)
acc, opt_a = nbdist.prepare(net, sgd(net), accumulate=k, **{extra!r})
big, opt_b = nbdist.prepare(big_net, sgd(big_net), **{extra!r})
for s in range(2):  # two optimizer steps each way
    for i in range(k):
        lo = (s * k + i) * b
        with nbdist.train_step(acc, opt_a) as step:
            step.backward(F.mse_loss(acc(x[lo:lo + b]), y[lo:lo + b]))
    with nbdist.train_step(big, opt_b) as step:
        step.backward(F.mse_loss(big(x[s * k * b:(s + 1) * k * b]), y[s * k * b:(s + 1) * k * b]))
moved = (flat(acc) - flat(make_net())).abs().max().item()
((flat(acc) - flat(big)).abs().max().item(), moved)
"""
    )
    err, moved = diff
    assert moved > 1e-3, "the accumulating model never stepped"
    assert err < 1e-5, f"accumulated parameters differ from the big batch's by {err}"


def test_accumulation_skips_the_all_reduce(ranks):
    """Only every k-th micro-step all-reduces: forward and backward both ran inside no_sync."""
    rounds = ranks.run(
        """
def counted(model):
    calls = []
    def hook(state, bucket):
        if bucket.is_last():
            calls.append(1)
        return dist.all_reduce(bucket.buffer().div_(dist.get_world_size()),
                               async_op=True).get_future().then(lambda f: f.value()[0])
    model.register_comm_hook(None, hook)
    return calls

out = []
for k in (1, 4):
    net = make_net()
    model, opt = nbdist.prepare(net, torch.optim.SGD(net.parameters(), lr=0.05), accumulate=k)
    calls = counted(model)
    x, y = data(64, seed=3)
    for i in range(8):
        with nbdist.train_step(model, opt) as step:
            step.backward(F.mse_loss(model(x[8 * i:8 * i + 8]), y[8 * i:8 * i + 8]))
    out.append(len(calls))
out
"""
    )
    assert rounds == [8, 2]


@pytest.mark.parametrize(
    "compress, options, tolerance",
    [
        ("fp16", {}, 1e-3),
        ("bf16", {}, 1e-2),
        # Gradients of rank <= 4 (2 samples on each of 2 ranks): rank-4 PowerSGD is exact.
        ("powersgd", {"powersgd_rank": 4, "powersgd_warmup": 2}, 1e-4),
    ],
)
def test_compression_changes_gradients_within_tolerance(ranks, compress, options, tolerance):
    errors = ranks.run(
        f"""
x, y = data(2, seed=20 + nbdist.rank())
def grads(**opts):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    model = nbdist.prepare(net, **opts)
    xx = torch.cat([x, x], 1).repeat(1, 16)[:, :64]
    for _ in range(3):  # PowerSGD compresses from its third step on (after warm-up)
        model.zero_grad()
        F.mse_loss(model(xx), y).backward()
    return [p.grad.clone() for p in model.parameters()]
exact, approx = grads(), grads(compress={compress!r}, **{options!r})
[((a - e).norm() / e.norm()).item() for a, e in zip(approx, exact)]
"""
    )
    assert max(errors) < tolerance, errors
    if compress != "powersgd":
        assert max(errors) > 0, "compression changed nothing: was the hook registered?"


def test_powersgd_low_rank_is_an_approximation(ranks):
    """Rank 1 on gradients of higher rank really compresses (the gradients change)."""
    err = ranks.run(
        """
x, y = data(16, seed=30 + nbdist.rank())
def grad0(**opts):
    torch.manual_seed(0)
    model = nbdist.prepare(nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1)), **opts)
    for _ in range(3):
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
    return next(model.parameters()).grad.clone()
e, a = grad0(), grad0(compress="powersgd", powersgd_rank=1, powersgd_warmup=2)
((a - e).norm() / e.norm()).item()
"""
    )
    assert 1e-3 < err < 1.0


def test_bf16_forward_runs_under_autocast_and_returns_float32(ranks):
    inner, outer = ranks.run(
        """
net = make_net()
seen = []
net[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
model = nbdist.prepare(net, precision="bf16")
out = model(torch.randn(4, 8))
(str(seen[0]), str(out.dtype))
"""
    )
    assert (inner, outer) == ("torch.bfloat16", "torch.float32")


def test_fp16_on_cpu_is_a_one_line_error(ranks):
    with pytest.raises(DistributedCellError) as e:
        ranks.run("nbdist.prepare(make_net(), precision='fp16')")
    msg = str(e.value)
    assert msg.startswith("ranks 0, 1: ")
    assert "precision='fp16' needs a GPU" in msg and "use precision='bf16' on CPU" in msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    "call, words",
    [
        ("nbdist.prepare(make_net(), precision='fp8')", "precision must be one of"),
        ("nbdist.prepare(make_net(), compress='zip')", "compress must be one of"),
        ("nbdist.prepare(make_net(), accumulate=0)", "accumulate must be a whole number >= 1"),
        ("nbdist.prepare(make_net(), strategy='zero3')", "strategy must be one of"),
        ("nbdist.prepare(make_net(), strategy='fsdp', compress='fp16')", "compress works with"),
        ("nbdist.prepare(make_net(), strategy='fsdp', static_graph=True)", "are DDP options"),
    ],
)
def test_bad_options_are_usage_errors(ranks, call, words):
    """Checked on the ranks, caught there: the message is what the person would read."""
    msg = ranks.run(
        f"try:\n    {call}\n    msg = None\nexcept nbdist.UsageError as e:\n    msg = str(e)\nmsg"
    )
    assert msg is not None and words in msg and "\n" not in msg


def test_train_step_needs_step_backward(ranks):
    msg = ranks.run(
        """
net = make_net()
model, opt = nbdist.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
x, y = data(4, seed=0)
try:
    with nbdist.train_step(model, opt) as step:
        F.mse_loss(model(x), y).backward()
    msg = None
except nbdist.UsageError as e:
    msg = str(e)
msg
"""
    )
    assert msg is not None and "call step.backward(loss)" in msg
