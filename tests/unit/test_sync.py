"""Sync modes' pure parts: the options' checks (``train.sync_options``) and DiLoCo's outer step
(``train.sync``)."""

from __future__ import annotations

import pytest
import torch

from nbdist.errors import UsageError
from nbdist.worker.train import sync, sync_options

OPT = object()  # any optimizer: the checks only ask whether there is one


def check(sync_mode="diloco", **kw):
    args = dict(optimizer=OPT, strategy="ddp", compress=None, precision=None, sync_every=4,
                sync_warmup=0, outer_lr=None, outer_momentum=None)  # fmt: skip
    return sync_options.check_options(sync_mode, **(args | kw))


def test_ddp_is_no_sync_plan_and_defaults_are_the_papers():
    assert check("ddp", sync_every=None) is None
    opts = check()
    assert (opts.mode, opts.every, opts.warmup) == ("diloco", 4, 0)
    assert (opts.outer_lr, opts.outer_momentum, opts.wire) == (0.7, 0.9, None)
    assert check("local_sgd", compress="bf16").wire == torch.bfloat16
    assert check(compress="fp16", sync_warmup=5).wire == torch.float16


def test_async_keeps_its_staleness_bound_and_defaults_it_later():
    assert check("async", max_staleness=3).max_staleness == 3
    assert check("async").max_staleness is None  # 4 x the world size, once it is known
    assert check("diloco").max_staleness is None


@pytest.mark.parametrize(
    "mode, kw, words",
    [
        ("zero", {}, "sync must be one of ('ddp', 'local_sgd', 'diloco', 'gossip', 'async'), not"),
        ("async", {"max_staleness": -1}, "max_staleness must be a whole number >= 0, not -1"),
        ("async", {"max_staleness": 2.5}, "max_staleness must be a whole number >= 0, not 2.5"),
        ("async", {"compress": "bf16"}, "drop compress='bf16'"),
        ("local_sgd", {"max_staleness": 3}, "max_staleness= is sync='async''s"),
        ("diloco", {"sync_every": None}, "sync='diloco' needs sync_every=H"),
        ("diloco", {"sync_every": 0}, "sync_every must be a whole number >= 1, not 0"),
        ("diloco", {"sync_every": True}, "sync_every must be a whole number >= 1, not True"),
        ("local_sgd", {"sync_warmup": 1.5}, "sync_warmup must be a whole number >= 0"),
        ("diloco", {"outer_lr": -1}, "outer_lr must be a number in (0, inf), not -1"),
        ("diloco", {"outer_lr": float("inf")}, "outer_lr must be a number in (0, inf)"),
        ("diloco", {"outer_momentum": 1.0}, "outer_momentum must be a number in [0, 1)"),
        ("diloco", {"outer_momentum": "0.9"}, "outer_momentum must be a number in [0, 1)"),
        ("local_sgd", {"outer_momentum": 0.5}, "outer_lr and outer_momentum are DiLoCo's"),
        ("ddp", {"sync_every": 2}, "sync_every and sync_warmup apply to sync='local_sgd'"),
        ("ddp", {"sync_every": None, "sync_warmup": 3}, "sync_every and sync_warmup apply"),
        ("diloco", {"optimizer": None}, "sync='diloco' needs the optimizer"),
        ("local_sgd", {"optimizer": None}, "sync='local_sgd' needs the optimizer"),
        ("local_sgd", {"strategy": "fsdp"}, "works with strategy='ddp' only, not 'fsdp'"),
        ("diloco", {"compress": "powersgd"}, "compress='powersgd' goes with sync='ddp'"),
        ("diloco", {"precision": "fp16"}, "use precision='bf16'"),
    ],
)
def test_bad_options_are_one_line(mode, kw, words):
    with pytest.raises(UsageError) as e:
        check(mode, **kw)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_outer_step_is_torchs_nesterov_sgd():
    torch.manual_seed(0)
    start = [torch.randn(5, 3), torch.randn(7)]
    grads = [[torch.randn_like(p) for p in start] for _ in range(4)]
    ours = [p.clone() for p in start]
    bufs = [torch.zeros_like(p) for p in start]
    theirs = [torch.nn.Parameter(p.clone()) for p in start]
    opt = torch.optim.SGD(theirs, lr=0.7, momentum=0.9, nesterov=True)
    for g in grads:
        sync.nesterov_(ours, g, bufs, 0.7, 0.9)
        for p, gi in zip(theirs, g, strict=True):
            p.grad = gi.clone()
        opt.step()
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b.detach(), rtol=1e-6, atol=1e-6)


def test_nothing_is_rank_local_without_a_local_plan():
    assert not sync.is_rank_local(torch.nn.Linear(2, 1))
