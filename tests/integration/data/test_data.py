"""Scatter, gather and loader end to end on real clusters."""

from __future__ import annotations

import importlib.util
import re

import numpy as np
import pytest
import torch
from labels import IMBALANCED, within_one_per_class
from paths import ROOT

import nbdist
from nbdist.config import CellOptions
from nbdist.worker import api

OWNER = """
def _nbdist_test_owner(a):
    while not isinstance(a, memoryview):
        a = a.base
    return type(a.obj).__name__
"""


def _on_ranks(cluster, source: str) -> list:
    """Run ``source`` (ending in an expression) on every rank; each rank's value."""
    prelude = "import numpy as np, torch\nfrom nbdist.worker.state import engine as _engine\n"
    prelude += OWNER
    cluster.run(f"{prelude}_nbdist_test_value = ({source})", CellOptions(timeout=60))
    return [cluster.pull("_nbdist_test_value", r) for r in range(len(cluster.slots))]


def _defined(cluster, name: str) -> list[bool]:
    return [
        cluster.client[s.engine_id].apply_sync(api.describe, name) is not None
        for s in cluster.slots
    ]


def _pending(cluster) -> list[int]:
    """Shards held on each rank under a token, not (yet) committed."""
    return _on_ranks(cluster, "len(_engine.pending_shards)")


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("remainder", ["uneven", "pad"])
def test_round_trip_numpy(cluster, capsys, shuffle, remainder):
    x = np.random.default_rng(0).standard_normal((1001, 3)).astype(np.float32)
    report = nbdist.scatter("rt", x, shuffle=shuffle, remainder=remainder)
    assert report.sizes == ([501, 500] if remainder == "uneven" else [501, 501])
    assert "'rt' scattered to 2 ranks" in capsys.readouterr().out
    back = nbdist.gather("rt")
    assert isinstance(back, np.ndarray) and back.dtype == np.float32
    assert np.array_equal(back, x)
    # rank order without the plan: the shards as they are on the engines
    assert len(nbdist.gather("rt", ordered=False)) == sum(report.sizes)


def test_round_trip_torch_and_tuple_and_drop(cluster):
    t = torch.randn(301, 4, dtype=torch.float64)
    nbdist.scatter("tt", t)
    kinds = _on_ranks(cluster, "(type(tt).__name__, tt.dtype == torch.float64, len(tt))")
    assert kinds == [("Tensor", True, 151), ("Tensor", True, 150)]
    back = nbdist.gather("tt")
    assert isinstance(back, torch.Tensor) and torch.equal(back, t)

    x, y = np.arange(1000, dtype=np.int32).reshape(500, 2), IMBALANCED[::2].copy()
    nbdist.scatter("xy", (x, torch.from_numpy(y)), stratify=y, remainder="drop")
    bx, by = nbdist.gather("xy")
    assert isinstance(by, torch.Tensor) and len(bx) == 500 and np.array_equal(bx, x)

    nbdist.scatter("odd", x[:301], remainder="drop", seed=5)
    kept = nbdist.gather("odd")
    assert len(kept) == 300
    rows = kept[:, 0] // 2  # which rows survived: in the original order, one left out
    assert np.all(np.diff(rows) > 0) and np.array_equal(kept, x[rows])


def test_engine_shards_are_writable_tensors_and_views_travel_without_copy(cluster):
    big = torch.randn(20_000, 16)  # 1.3 MB: sent as a frame, not inlined
    nbdist.scatter("big", big, shuffle=False)
    res = _on_ranks(cluster, "(big.numpy().flags.writeable, big.is_contiguous(), len(big))")
    assert res == [(True, True, 10_000)] * 2
    _on_ranks(cluster, "big.mul_(2)")  # in place, no "non-writable" trouble
    assert torch.equal(nbdist.gather("big"), big * 2)
    # a numpy shard lives in the memory of the message that brought it: no copy on arrival
    nbdist.scatter("bignp", big.numpy())
    assert _on_ranks(cluster, "_nbdist_test_owner(bignp)") == ["Frame", "Frame"]


def test_stratified_scatter_on_an_imbalanced_label_set(cluster, capsys):
    x = np.random.default_rng(1).standard_normal((1000, 2)).astype(np.float32)
    report = nbdist.scatter("strat", (x, IMBALANCED), stratify=IMBALANCED, seed=11)
    out = capsys.readouterr().out
    assert report.warnings == [] and "warning" not in out
    assert "label 4" in out  # the histogram, every class
    labels = _on_ranks(cluster, "strat[1]")
    within_one_per_class(IMBALANCED, labels, 2)
    assert report.counts.tolist() == [[int((p == c).sum()) for c in range(5)] for p in labels]

    report = nbdist.scatter("unstrat", (x, IMBALANCED), labels=IMBALANCED, shuffle=False)
    assert len(report.warnings) == 2
    assert "rank 1's shard is not representative" in capsys.readouterr().out


def test_gather_follows_a_scattered_order_and_stacks_single_values(cluster):
    x = np.arange(203, dtype=np.float32)
    nbdist.scatter("feats", x, seed=3)
    _on_ranks(cluster, "globals().update(pred=feats * 2, loss=torch.tensor(float(len(feats))))")
    assert np.array_equal(nbdist.gather("pred", like="feats"), x * 2)
    assert not np.array_equal(nbdist.gather("pred"), x * 2)  # rank order: still shuffled
    assert nbdist.gather("loss").tolist() == [102.0, 101.0]


DDP_CELL = """
import torch
torch.manual_seed(0)
model = nbdist.prepare(torch.nn.Linear(4, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
train_dl = nbdist.loader("train", batch_size=10)
ds_dl = nbdist.loader(torch.utils.data.TensorDataset(torch.randn(101, 4)), batch_size=10)
naive = len(range(0, len(train[0]), 10))  # batches a plain per-rank loop would make
counts, firsts = [], []
for epoch in range(3):
    n = 0
    for xb, yb in train_dl:
        if n == 0:
            firsts.append(xb[0].tolist())
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()  # all-reduce: all or hang
        opt.step()
        n += 1
    for (xb,) in ds_dl:
        opt.zero_grad()
        model(xb).sum().backward()
        opt.step()
        n += 1
    counts.append(n)
counts
"""


def test_loader_gives_equal_batch_counts_in_ddp_with_uneven_shards(cluster):
    gen = np.random.default_rng(2)
    x, y = gen.standard_normal((101, 4)).astype(np.float32), gen.integers(0, 3, 101)
    report = nbdist.scatter("train", (x, y))
    assert report.sizes == [51, 50]
    # would hang at the end of the first epoch with unequal counts: the deadline ends it
    assert cluster.run(DDP_CELL, CellOptions(timeout=90)) == [12, 12, 12]
    naive = [cluster.pull("naive", r) for r in range(2)]
    assert naive == [6, 5]  # without nbdist.loader the ranks would disagree
    assert [cluster.pull("counts", r) for r in range(2)] == [[12, 12, 12]] * 2
    firsts = cluster.pull("firsts", 0)
    assert len({tuple(f) for f in firsts}) == 3  # reshuffled every epoch


# -- failing well -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: nbdist.scatter("e", (np.zeros((10, 2)), np.zeros(9))),
            "different lengths [10, 9]: features and labels need one row per sample",
        ),
        (lambda: nbdist.scatter("e", [1, 2, 3]), "but the data is a list: convert it"),
        (lambda: nbdist.scatter("e", np.array([{}, {}], dtype=object)), "has dtype object"),
        (
            lambda: nbdist.scatter("e", np.zeros(1)),
            "the data has 1 rows but there are 2 ranks: each rank needs at least one",
        ),
        (lambda: nbdist.scatter("e x", np.zeros(10)), "'e x' is not a valid variable name"),
        (lambda: nbdist.scatter("class", np.zeros(10)), "'class' is not a valid variable name"),
        (
            lambda: nbdist.scatter("e", np.zeros(10), stratify=np.zeros(9)),
            "stratify has 9 labels but the data has 10 rows",
        ),
        (
            lambda: nbdist.scatter("e", np.zeros(10), remainder="wrap"),
            "remainder must be 'drop', 'pad' or 'uneven'",
        ),
        (
            lambda: nbdist.scatter("e", np.broadcast_to(np.float32(0), (3_000_000, 1 << 13))),
            "scatter of 'e' needs",
        ),
    ],
)
def test_scatter_errors_are_one_line_and_send_nothing(cluster, call, message):
    with pytest.raises(nbdist.UsageError) as info:
        call()
    assert message in str(info.value) and "\n" not in str(info.value)
    assert _defined(cluster, "e") == [False, False] and _pending(cluster) == [0, 0]


def test_memory_refusal_gives_the_figures(cluster):
    huge = np.broadcast_to(np.float32(0), (3_000_000, 1 << 13))  # 98 GB, no memory behind it
    with pytest.raises(
        nbdist.UsageError,
        match=r"^scatter of 'huge' needs 196\.6 GB of memory on "
        r".+ \(ranks 0, 1 and the notebook\) but only [\d.]+ GB is available there: "
        r"send less data .*, or shuffle=False to send without a copy$",
    ):
        nbdist.scatter("huge", huge)  # 98 GB for the engines, 98 GB for the shuffled copies
    with pytest.raises(
        nbdist.UsageError,
        match=r"needs 98\.3 GB of memory on .+ \(ranks 0, 1\) "
        r"but only [\d.]+ GB is available there: send less data",
    ):
        nbdist.scatter("huge", huge, shuffle=False)  # views: no copy in the notebook


BREAK_RECEIVING = """
from nbdist.worker.state import engine as _engine

class _Full(dict):
    def __setitem__(self, key, value):
        raise MemoryError("no room for the shard")

_engine.pending_shards = _Full()
"""


def test_a_rank_failing_midway_leaves_nothing_anywhere(cluster):
    rank1 = cluster.client[cluster.slots[1].engine_id]
    rank1.execute(BREAK_RECEIVING, block=True)
    try:
        with pytest.raises(nbdist.UsageError) as info:
            nbdist.scatter("half", np.ones((100, 3)))
    finally:
        rank1.execute("_engine.pending_shards = {}", block=True)
    assert str(info.value) == (
        "scatter of 'half' failed on rank 1: MemoryError: no room for the "
        "shard; nothing was kept on any rank"
    )
    assert _defined(cluster, "half") == [False, False]
    assert _pending(cluster) == [0, 0]  # rank 0 dropped the shard it had received


def test_gather_and_loader_errors(cluster):
    with pytest.raises(nbdist.UsageError, match="'nowhere' is not defined on ranks 0, 1"):
        nbdist.gather("nowhere")
    _on_ranks(cluster, "globals().update(obj={'a': 1}, arr=np.zeros(3))")
    with pytest.raises(
        nbdist.UsageError,
        match=r"'obj' on rank 0 is a dict: bring it with "
        r"nbdist.pull\('obj', 0\)",
    ):
        nbdist.gather("obj")
    with pytest.raises(nbdist.UsageError, match="'obj' was not scattered"):
        nbdist.gather("arr", like="obj")
    with pytest.raises(nbdist.DistributedCellError, match="'obj' was not scattered to this rank"):
        cluster.run("nbdist.loader('obj', 4)", CellOptions(timeout=30))
    with pytest.raises(nbdist.UsageError, match="is not a valid variable name"):
        nbdist.gather("no such")
    with pytest.raises(
        nbdist.DistributedCellError,
        match="the dataset has 1 samples but there are 2 ranks: each rank needs at least one",
    ):
        cluster.run("import torch\nnbdist.loader(torch.utils.data.TensorDataset(torch.ones(1)), 4)")
    with pytest.raises(nbdist.UsageError, match="runs on nbdist engines only"):
        nbdist.loader("obj", 4)  # in the notebook


def test_magic_scatter(cluster, capsys):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbdist")
    shell.user_ns.update(feats=np.arange(40.0).reshape(20, 2), labels=np.repeat([0, 1], 10))
    shell.run_line_magic("nbdist", "scatter feats --stratify labels --as mfeats --seed 3")
    out = capsys.readouterr().out
    assert "'mfeats' scattered to 2 ranks" in out and "label 1" in out
    assert _on_ranks(cluster, "len(mfeats)") == [10, 10]
    assert np.array_equal(nbdist.gather("mfeats"), shell.user_ns["feats"])
    shell.run_cell("%nbdist scatter missing")
    out = capsys.readouterr()
    shown = re.sub(r"\x1b\[[0-9;]*m", "", out.out + out.err)  # without the colours
    assert "UsageError: 'missing' is not defined in the notebook" in shown
    assert not _defined(cluster, "missing")[0]


def test_benchmark_smoke(cluster, capsys):
    path = ROOT / "benchmarks" / "bench_scatter.py"
    spec = importlib.util.spec_from_file_location("bench_scatter", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    best = bench.main(["--size-mb", "2", "--repeat", "1"])
    assert len(best) == 5 and all(0 < s < 60 for s in best.values())
    out = capsys.readouterr().out
    assert "ipyparallel view.scatter (baseline)" in out and "GB/s" in out
    assert _defined(cluster, "bench_a") == [False, False]  # it cleans up after itself
