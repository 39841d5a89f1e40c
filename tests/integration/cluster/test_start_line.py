"""A start that takes a while says, in one line under the cell updated in place, how many
engines are up and what the rest wait for (``cluster.progress``), and at its end how it ended."""

from __future__ import annotations

from kernels import shutdown_kernel, start_kernel


def test_a_large_start_shows_one_live_line_of_what_it_waits_for():
    k = start_kernel()
    try:
        got = k.ok("%nbdist start -n 24 --oversubscribe", timeout=240)
        lines = [text for texts in got.in_place.values() for text in texts]
        assert len(got.in_place) == 1, got.in_place  # one line, updated
        assert any("engines registered; waiting for" in t for t in lines), lines
        assert lines[-1].startswith("start: 24 engines up, their process group formed ("), lines
        k.ok("%nbdist stop")
    finally:
        shutdown_kernel(k)
