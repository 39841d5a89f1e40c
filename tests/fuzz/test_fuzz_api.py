"""Hostile arguments to every public function, on a real 2-engine cluster (Python API).

Notebook-side functions must return or raise one ``UsageError``; engine-side functions, called
in a cell, must return or fail the cell with a ``UsageError`` as the rank's error. Afterwards the
cluster still runs a collective on both ranks.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from fuzzing import FUZZ, py_values
from hypothesis import given
from hypothesis import strategies as st

import nbdist
from nbdist.config import CellOptions
from nbdist.errors import DistributedCellError, UsageError

ALIVE_CHECK = "import torch\nt = torch.ones(1)\ntorch.distributed.all_reduce(t)\nt.item()"


@pytest.fixture(scope="module")
def ready(cluster, tmp_path_factory, monkeypatch_module):
    monkeypatch_module.chdir(tmp_path_factory.mktemp("fuzz-api"))
    cluster.run("z = nbdist.rank()")
    return cluster


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def _usable(cluster) -> None:
    assert cluster.run(ALIVE_CHECK) == 2.0, "the cluster is broken"


def _only_usage_errors(call, cluster) -> None:
    try:
        call()
    except UsageError:
        pass
    _usable(cluster)


kwargs = st.dictionaries(
    st.sampled_from(
        ["timeout", "ranks", "all_output", "restarts", "min_workers", "progress_timeout", "grace"]
    ),
    py_values,
    max_size=3,
)


@FUZZ
@given(options=kwargs)
def test_cell_options(ready, options):
    def call():
        ready.run("1", CellOptions(**options))

    try:
        _only_usage_errors(call, ready)
    except DistributedCellError as e:  # a tiny timeout stops even this cell: said in one line
        assert "past --timeout" in str(e), e
        _usable(ready)


@FUZZ
@given(name=py_values, rank=py_values)
def test_pull(ready, name, rank):
    _only_usage_errors(lambda: nbdist.pull(name, rank=rank), ready)


@FUZZ
@given(
    data=st.sampled_from(["rows", "tuple", "ragged", "scalar", "text", "none", "empty"]),
    name=st.one_of(st.just("X"), py_values),
    options=st.dictionaries(
        st.sampled_from(["shuffle", "seed", "stratify", "labels", "remainder"]),
        st.one_of(py_values, st.sampled_from(["labels", "float_labels", "nan_labels"])),
        max_size=3,
    ),
)
def test_scatter(ready, data, name, options):
    rows = np.arange(40, dtype=np.float32).reshape(20, 2)
    made = {
        "rows": rows,
        "tuple": (rows, np.arange(20) % 3),
        "ragged": (rows, np.arange(7)),
        "scalar": np.float32(3),
        "text": "abc",
        "none": None,
        "empty": rows[:0],
    }
    labels = {
        "labels": np.arange(20) % 3,
        "float_labels": np.linspace(0, 1, 20),
        "nan_labels": np.where(np.arange(20) == 3, np.nan, 1.0),
    }
    opts = {k: labels.get(v, v) if isinstance(v, str) else v for k, v in options.items()}
    _only_usage_errors(lambda: nbdist.scatter(name, made[data], **opts), ready)


@FUZZ
@given(name=py_values, like=py_values, ordered=py_values)
def test_gather(ready, name, like, ordered):
    _only_usage_errors(lambda: nbdist.gather(name, like=like, ordered=ordered), ready)


@FUZZ
@given(
    rule=st.dictionaries(
        st.sampled_from(["keep_checkpoints", "keep_runs", "keep_days", "keep_logs", "log_bytes"]),
        py_values,
        max_size=3,
    ),
    dry_run=st.sampled_from([True, None, 1, "no"]),
)
def test_gc_plans(ready, rule, dry_run):
    # dry runs only: the plan is worked out and shown, nothing is freed
    _only_usage_errors(lambda: str(nbdist.gc(dry_run=dry_run, **rule)), ready)


@FUZZ
@given(limit=py_values, refs=st.lists(py_values, max_size=3))
def test_runs_and_compare(ready, limit, refs):
    _only_usage_errors(lambda: nbdist.runs(limit), ready)
    _only_usage_errors(lambda: nbdist.compare(*refs), ready)


@FUZZ
@given(file=py_values, args=st.lists(py_values, max_size=2), timeout=py_values)
def test_run_script(ready, file, args, timeout):
    _only_usage_errors(lambda: nbdist.run_script(file, *args, timeout=timeout), ready)


@FUZZ
@given(n=py_values, threads=py_values, backend=py_values, ip=py_values)
def test_start_with_a_cluster_running(ready, n, threads, backend, ip):
    _only_usage_errors(
        lambda: nbdist.start(n=n, threads_per_engine=threads, backend=backend, ip=ip), ready
    )


ENGINE_CALLS = [
    "nbdist.report(step={a}, loss={b}, samples={c}, total={d})",
    "nbdist.report(**{{str({a}): {b}}})",
    "nbdist.prepare(torch.nn.Linear(2, 2), precision={a}, strategy={b})",
    "nbdist.checkpoint({a}, every={b}, dir='ckpt', x=torch.zeros(1))",
    "nbdist.restore(dir={a}, x={b})",
    "next(iter(nbdist.steps({a}, every={b}, dir='ckpt', x=torch.zeros(1))), None)",
    "nbdist.loader({a}, batch_size={b})",
]


def _literal(value) -> str:
    """``value`` as Python source (``repr`` of NaN is ``nan``, not an expression)."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"float({str(value)!r})"
    return repr(value)


@FUZZ
@given(
    call=st.sampled_from(ENGINE_CALLS),
    values=st.tuples(py_values, py_values, py_values, py_values),
)
def test_engine_side_functions(ready, call, values):
    a, b, c, d = (_literal(v) for v in values)
    source = "import torch\n" + call.format(a=a, b=b, c=c, d=d)
    try:
        ready.run(source)
    except DistributedCellError as e:
        # the rank(s) the bad argument failed on say so in one line; the others are bystanders
        causes = [f for f in e.failures if not f.bystander]
        assert causes and all(f.summary.startswith("UsageError: ") for f in causes), e.report()
    _usable(ready)
