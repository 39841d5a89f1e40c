"""The benchmark harness runs end to end at a tiny size (a smoke test: the figures mean nothing)."""

from __future__ import annotations

import re
import sys

import background
import pytest
from paths import ROOT
from processes import assert_gone

from benchmarks import Result, table
from benchmarks.__main__ import _as_result


def test_table_shows_ratio_and_target():
    rows = [
        Result("fast", 99.0, 100.0, "samples/s", ">= 0.98"),
        Result("slow start", 3.0, 4.0, "s", "< 0.5"),
        Result("no target", 1.0, 2.0),
    ]
    text = table(rows)
    assert re.search(r"\| fast\s+\| 99\s+\| 100\s+\| samples/s \| 0\.990 \| >= 0\.98 \| met", text)
    assert re.search(r"\| slow start .*\| 0\.750 \| < 0\.5\s+\| MISSED", text)
    assert [r.met for r in rows] == [True, False, None]


def test_foreign_results_are_read():
    r = _as_result({"name": "scatter", "value": 2.0, "baseline": 4.0, "unit": "GB/s", "x": 1}, "b")
    assert (r.name, r.ratio, r.unit) == ("scatter", 0.5, "GB/s")
    assert "unreadable" in _as_result(object(), "bench_x").note


#: The tiny run, two benchmarks at a time (the figures of a smoke run mean nothing). It starts
#: when the suite is collected and runs beside the other tests at a small CPU weight where
#: this machine allows (``tests/conftest.py``, ``tests/background.py``); this test, run last,
#: collects it.
BESIDE = [sys.executable, "-m", "benchmarks", "--tiny", "--jobs", "2"]


@pytest.mark.timeout(600)
def test_whole_harness_runs_tiny():
    """``python -m benchmarks --tiny``: every benchmark runs, the table has every row, and no
    process it started (kernels, engines, torchrun workers) outlives it."""
    # started with the suite, or (no cgroup for that here) now
    run = background.RUNNING.pop(__name__, None) or background.in_turn(BESIDE, ROOT)
    try:
        code, out, err = run.wait(560)
        assert code == 0, f"{out}\n{err[-3000:]}"
        for row in (
            "start: %nbdist start -n 2 / ipyparallel + hand-made group",
            "train mlp: %%distributed / torchrun",
            "train cnn: %%distributed / torchrun",
            "report() every step + dashboard / silent",
            "silent %%distributed / torchrun, same loop",
            'loopback: compress="fp16" / ddp, s to 0%',
            "loopback: gossip H=4 / ddp, s to 0%",
            "loopback: async H=4 / ddp, s to 0%",
            "pipeline 4x32 MLP, 2 stages: params+grads+Adam held per rank / one process",
            "throughput, batch 8: pipeline 1f1b 2 ranks / DDP 2 ranks",
            "1f1b M=4: idle share (measured) / bubble (S-1)/(M+S-1)",
            "params+grads+Adam per rank, dp=2 × tp=2 / one process",
            "mesh throughput, batch 4: pp=2 × dp=2 / one process",
            "mesh checkpoint load: dp=2 × tp=2 sharded (dcp) / dp=4 gathered",
            "sweep 4 lr, mlp 2x256, batch 64, 3 steps: 1-rank trials / 2-rank DDP in turn",
            "(communication): 1-rank trials / 2-rank DDP in turn",
            "(compute): 1-rank trials / 2-rank DDP in turn",
        ):
            line = next((ln for ln in out.splitlines() if row in ln), None)
            assert line is not None, f"no row {row!r} in:\n{out}"
            ratio = float(line.split("|")[5])
            assert ratio > 0, line
        assert "TINY" in out
        assert len(run.seen) >= 4, (
            "the harness should have started kernels, engines and torchrun workers"
        )
        assert_gone(list(run.seen.values()), timeout=20)
    finally:
        run.kill()  # what is left after the check above (nothing, if it passed), and its cgroup
