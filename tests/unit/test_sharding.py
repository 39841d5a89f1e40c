"""Scatter and gather without a cluster: the sharding plan, the checks before sending, the wire."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from labels import IMBALANCED, within_one_per_class

import nbdist
from nbdist import wire
from nbdist.notebook.data.scatter import checks as data_checks
from nbdist.notebook.data.sharding import (
    label_counts,
    label_warnings,
    plan,
    restore_order,
    shard_sizes,
)
from nbdist.protocol import ValueInfo
from nbdist.worker.data.indexed import batch_count, dataset_order, epoch_order, split_batches


# -- the plan, without a cluster ------------------------------------------------------------------
@pytest.mark.parametrize("remainder", ["drop", "pad", "uneven"])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("stratified", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_plan_covers_every_row_once_with_the_promised_sizes(remainder, world, stratified, shuffle):
    n = 1003
    labels = np.resize(IMBALANCED, n) if stratified else None
    shards_ = plan(n, world, shuffle=shuffle, seed=7, labels=labels, remainder=remainder)
    assert [s.size for s in shards_] == shard_sizes(n, world, remainder)
    kept = np.concatenate([s.row_indices() for s in shards_])
    assert len(np.unique(kept)) == len(kept)  # no row twice (repeats are in pad only)
    assert len(kept) == (n // world * world if remainder == "drop" else n)
    for s in shards_:  # repeats are rows of the same shard
        assert np.isin(s.pad, s.row_indices()).all()
    if not shuffle and not stratified:
        assert all(isinstance(s.rows, slice) for s in shards_)  # sent as views, no copy
    # restore_order is the inverse: per-rank rows come back in the data set's order
    x = np.arange(n) * 10
    back = restore_order([x[s.indices()] for s in shards_], shards_)
    assert np.array_equal(back, x[np.sort(kept)])


def test_shard_sizes():
    assert shard_sizes(101, 2, "uneven") == [51, 50]
    assert shard_sizes(101, 2, "pad") == [51, 51]
    assert shard_sizes(101, 2, "drop") == [50, 50]
    assert shard_sizes(9, 3, "pad") == [3, 3, 3]


def test_shuffle_is_deterministic_from_the_seed():
    a, b, c = (plan(500, 2, seed=s) for s in (1, 1, 2))
    assert all(np.array_equal(x.rows, y.rows) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0].rows, c[0].rows)
    assert not np.array_equal(np.sort(a[0].rows), np.arange(250))  # rows really are shuffled


@pytest.mark.parametrize("world", [2, 3, 4, 7])
@pytest.mark.parametrize("remainder", ["drop", "pad", "uneven"])
def test_stratified_shards_keep_proportions_within_one_sample(world, remainder):
    shards_ = plan(len(IMBALANCED), world, seed=3, labels=IMBALANCED, remainder=remainder)
    parts = [IMBALANCED[s.row_indices()] for s in shards_]
    within_one_per_class(np.concatenate(parts), parts, world)  # drop: of the rows kept
    counts = label_counts(IMBALANCED, shards_, 5)
    assert label_warnings([str(c) for c in range(5)], counts, np.bincount(IMBALANCED)) == []


def test_report_warns_when_a_shard_is_not_representative():
    shards_ = plan(len(IMBALANCED), 2, shuffle=False)  # sorted labels, split in two blocks
    counts = label_counts(IMBALANCED, shards_, 5)
    warnings = label_warnings(list("abcde"), counts, np.bincount(IMBALANCED))
    assert len(warnings) == 2
    assert warnings[0].startswith(
        "warning: rank 0's shard is not representative: label a is "
        "100.0 % of it but 70.0 % of the whole"
    )


def test_epoch_order_pads_every_rank_to_the_same_length():
    sizes = [51, 50]
    orders = [
        epoch_order(s, max(sizes), shuffle=True, seed=0, epoch=0, rank=r)
        for r, s in enumerate(sizes)
    ]
    assert [len(o) for o in orders] == [51, 51]
    assert sorted(orders[1][:50]) == list(range(50))  # every own row, then a repeat of one
    assert [len(split_batches(o, 10, False)) for o in orders] == [6, 6]
    assert [len(split_batches(o, 10, True)) for o in orders] == [5, 5]
    # reshuffled each epoch, the same for the same seed and epoch
    e0, e0b, e1 = (epoch_order(50, 50, shuffle=True, seed=4, epoch=e, rank=1) for e in (0, 0, 1))
    assert np.array_equal(e0, e0b) and not np.array_equal(e0, e1)
    assert batch_count(51, 10, False) == 6 and batch_count(51, 10, True) == 5


@pytest.mark.parametrize("n,world", [(101, 2), (10, 3), (7, 7), (100, 4)])
def test_dataset_order_is_distributed_sampler_like(n, world):
    for epoch in range(2):
        parts = [
            dataset_order(n, world, r, shuffle=True, seed=1, epoch=epoch) for r in range(world)
        ]
        assert {len(p) for p in parts} == {math.ceil(n / world)}
        assert set(np.concatenate(parts).tolist()) == set(range(n))


def test_torch_travels_as_a_view_of_its_memory():
    t = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    arr, tag = wire.to_wire(t)
    assert np.shares_memory(arr, t.numpy()) and tag == "torch:float32"
    back = wire.from_wire(arr, tag)
    assert back.data_ptr() == t.data_ptr()
    bf = torch.randn(5, 2).to(torch.bfloat16)  # no numpy dtype: travels as int16 bits
    arr, tag = wire.to_wire(bf)
    assert arr.dtype == np.int16 and torch.equal(wire.from_wire(arr, tag), bf)


def test_a_shard_sends_contiguous_rows_as_a_view():
    x = np.arange(20).reshape(10, 2)
    block, shuffled = plan(10, 2, shuffle=False)[0], plan(10, 2, seed=1)[0]
    assert np.shares_memory(block.take(x), x) and np.array_equal(block.take(x), x[:5])
    assert not np.shares_memory(shuffled.take(x), x)
    assert np.array_equal(shuffled.take(x), x[shuffled.indices()])
    padded = plan(9, 2, shuffle=False, remainder="pad")[1]  # rows 5..8, then one repeated
    assert not np.shares_memory(padded.take(x), x) and len(padded.take(x)) == 5


def test_the_kernel_side_of_data_imports_no_torch():
    modules = "nbdist.notebook.data.sharding, nbdist.notebook.data.checks, nbdist.wire"
    code = f"import sys, {modules}, nbdist.worker.api\nassert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_memory_check_gives_the_figures_per_host():
    fix = "send less data"
    with pytest.raises(nbdist.UsageError) as info:  # two ranks on one host, the smaller free
        data_checks.check_memory([("h1", 1000), ("h1", 900)], [500, 500], 0, "scatter of 'x'", fix)
    assert str(info.value) == (
        "scatter of 'x' needs 1.0 KB of memory on h1 (ranks 0, 1) but only "
        "900 bytes is available there: send less data"
    )
    with pytest.raises(nbdist.UsageError, match=r"200 bytes of memory on b \(rank 1\) but only "):
        data_checks.check_memory([("a", 10**9), ("b", 100)], [10, 200], 0, "scatter", fix)
    with pytest.raises(nbdist.UsageError, match=r"on .+ \(the notebook\) but only"):
        data_checks.check_memory([("elsewhere", 1 << 40)], [1], 1 << 62, "scatter", fix)
    data_checks.check_memory([("a", 1000), ("b", 1000)], [900, 900], 0, "scatter", fix)  # fits


def test_gather_refuses_what_cannot_be_joined():
    arr = ValueInfo(type="ndarray", ok=True, shapes=((5, 2),), dtypes=("float32",), nbytes=40)
    with pytest.raises(
        nbdist.UsageError,
        match="^'p' is not defined on ranks 1, 2: define it in a %%distributed cell first$",
    ):
        data_checks.check_joinable("p", [arr, None, None])
    with pytest.raises(
        nbdist.UsageError,
        match=r"'p' on rank 1 is a dict: bring it with "
        r"nbdist.pull\('p', 1\)",
    ):
        data_checks.check_joinable("p", [arr, ValueInfo(type="dict", ok=False)])
    wide = dataclasses.replace(arr, shapes=((5, 3),))
    with pytest.raises(
        nbdist.UsageError,
        match=r"^'p' has dtype float32 and shape \(5, 2\) on "
        r"rank 0 but float32 and \(5, 3\) on rank 1: the ranks' rows must match",
    ):
        data_checks.check_joinable("p", [arr, wide])
    data_checks.check_joinable(
        "p", [arr, dataclasses.replace(arr, shapes=((4, 2),))]
    )  # rows may differ


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: data_checks.arrays_of((np.zeros((10, 2)), np.zeros(9))),
            "different lengths [10, 9]: features and labels need one row per sample",
        ),
        (lambda: data_checks.arrays_of([1, 2, 3]), "but the data is a list: convert it"),
        (lambda: data_checks.arrays_of((np.zeros(3), "a")), "but element 1 of the tuple is a str"),
        (lambda: data_checks.arrays_of(()), "scatter got an empty tuple"),
        (lambda: data_checks.arrays_of(np.float32(1.0)), "but the data is a float32"),
        (lambda: data_checks.arrays_of(np.array(1.0)), "the data is a single value (0-d)"),
        (
            lambda: data_checks.labels_of(np.zeros((3, 2)), 3, "stratify"),
            "stratify needs one label per row (a 1-D array), not shape (3, 2)",
        ),
        (lambda: data_checks.labels_of([0, 1], 2, "labels"), "labels must be a 1-D numpy array"),
        (
            lambda: data_checks.labels_of(np.linspace(0, 1, 5), 5, "stratify"),
            "stratify has labels that are not whole numbers (such as 0.25): each value would be "
            "a class of its own; bin them first, e.g. np.digitize(y, bins)",
        ),
        (
            lambda: data_checks.labels_of(np.array([0.0, np.nan, 1.0]), 3, "stratify"),
            "stratify has a NaN or infinite label (row 1): drop or fill those rows first",
        ),
        (
            lambda: data_checks.labels_of(np.array([0, 1], dtype=object), 2, "stratify"),
            "stratify has dtype object: convert it to integers or strings",
        ),
        (
            lambda: data_checks.labels_of(np.array([1j, 2]), 2, "labels"),
            "labels has complex labels",
        ),
        (
            lambda: data_checks.labels_of(torch.ones(3, dtype=torch.bfloat16), 3, "stratify"),
            "stratify has dtype bfloat16: convert it, e.g. y.long()",
        ),
        (
            lambda: data_checks.labels_of(np.zeros(4), 5, "stratify"),
            "stratify has 4 labels but the data has 5 rows",
        ),
        (lambda: data_checks.check_options("wrap", 0), "remainder must be 'drop', 'pad' or"),
        (lambda: data_checks.check_options("pad", True), "seed must be a whole number >= 0"),
        (lambda: data_checks.check_options("pad", -1), "seed must be a whole number >= 0"),
        (lambda: data_checks.check_name("nbdist"), "'nbdist' is the nbdist module"),
        (lambda: data_checks.check_name("def", "like"), "like 'def' is not a valid variable"),
    ],
)
def test_checks_before_sending_are_one_line(call, message):
    with pytest.raises(nbdist.UsageError) as info:
        call()
    assert message in str(info.value) and "\n" not in str(info.value)


def test_arrays_of_shares_the_datas_memory():
    x, t = np.zeros((4, 2)), torch.ones(4)
    tags, arrays, is_tuple = data_checks.arrays_of((x, t))
    assert tags == ["numpy", "torch:float32"] and is_tuple
    assert arrays[0] is x and np.shares_memory(arrays[1], t.numpy())
    assert data_checks.labels_of(torch.arange(4), 4, "stratify").tolist() == [0, 1, 2, 3]


def test_whole_number_float_labels_are_classes_like_integers():
    as_float = data_checks.labels_of(np.array([0.0, 1.0, 1.0, 2.0, 0.0, 2.0]), 6, "stratify")
    shards = plan(6, 2, labels=as_float)
    same = plan(6, 2, labels=as_float.astype(int))
    assert [s.indices().tolist() for s in shards] == [s.indices().tolist() for s in same]


def test_a_scatters_report_shows_once_as_its_table_and_its_labels_in_order(capsys):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    setup = "from nbdist.notebook.data.sharding import ShardReport\nimport numpy as np\n"
    made = "r = ShardReport('t', [2, 2], [0, 0], 4, 64, 0.1, 'in order')\n"
    halves = "[Shard(slice(0, 2), np.array([], int)), Shard(slice(2, 4), np.array([], int))]"
    labels = f"r.add_labels(np.array([3, 1, 3, 2]), {halves})\n"
    shell.run_cell(setup + "from nbdist.notebook.data.sharding import Shard\n")
    shell.run_cell(made + labels + "r.show()\nr", store_history=True)
    out = capsys.readouterr().out
    assert out.count("'t' scattered to 2 ranks") == 1 and "ShardReport" not in out
    header = next(line for line in out.splitlines() if line.lstrip().startswith("rank"))
    assert header.split()[2:] == ["label", "1", "label", "2", "label", "3"]
    shell.run_cell("r", store_history=True)  # asked for in a later cell: shown again
    assert capsys.readouterr().out.count("scattered to 2 ranks") == 1
