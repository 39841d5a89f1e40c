"""``benchmarks/bench_streaming.py --quick`` runs end to end on a real 2-rank cluster and prints
its ratio lines and tables (a smoke test: a tiny dataset's figures mean nothing)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("pyarrow")

from benchmarks import bench_streaming  # noqa: E402


def test_quick_run_prints_the_ratios_and_removes_its_data(cluster, capsys, tmp_path):
    results = bench_streaming.main(["--quick", "--dir", str(tmp_path)])
    out = capsys.readouterr().out
    for size in ("1x", "2x"):
        for shuffle in (False, True):
            line = rf"ratio nbdist / DataLoader\+DistributedSampler samples/s, {size} [\d.]+ GB, "
            assert re.search(line + rf"shuffle={shuffle}: \d+\.\d\d\n", out), out
    assert "peak RSS MB" in out and "2x / 1x" in out
    speeds = [r for r in results if r.unit == "samples/s"]
    assert len(speeds) == 4 and all(r.value > 0 and r.baseline > 0 for r in speeds)
    assert all(r.value > 0 for r in results if r.unit == "MB")
    assert list(tmp_path.iterdir()) == []  # the data is removed at the end (no --keep)
    # the cells' figures are not left on the ranks
    assert cluster.run("'_bench_streaming_result' in globals()") is False
