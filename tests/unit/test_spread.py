"""The one rule for many ranks (``telemetry.spread``), as the board and the server both use it:
a rank is an outlier past a robust z-score of 3.5 from the median and MAD, stays one until it
falls under 2, at most 3 named, the farthest first; the band is the ranks' lowest to highest at
each settled step."""

from __future__ import annotations

from nbdist.telemetry.spread import Spread, outliers_of


def _values(**far: float) -> dict[int, float]:
    values = {r: 1.0 + 0.01 * (r % 5) for r in range(64)}
    values.update({int(k[1:]): v for k, v in far.items()})
    return values


def test_outliers_enter_at_3_5_and_leave_under_2():
    assert outliers_of(_values()) == []
    assert outliers_of(_values(r40=5.0, r3=-2.0)) == [40, 3]  # the farthest first
    assert outliers_of(_values(r5=9, r6=8, r7=7, r8=6)) == [5, 6, 7]  # at most 3
    assert outliers_of({0: 1.0, 1: 1.0, 2: 9.0}) == []  # too few ranks to judge
    # rank 40 at a z-score of about 3 (MAD 0.01 x 1.4826): not in, but kept once in
    mid = _values(r40=1.02 + 3 * 0.01 * 1.4826)
    assert outliers_of(mid) == [] and outliers_of(mid, were=[40]) == [40]


def test_the_band_is_each_settled_steps_lowest_and_highest():
    s = Spread()
    for r in range(10):
        s.add_values(r, 0, {"loss": float(r)})
        s.add_values(r, 1, {"loss": 2.0 * r})
    s.add_values(3, None, {"loss": 99.0})  # no step: left out
    s.settle("loss", 0)
    assert (s.lo["loss"].x, s.lo["loss"].y, s.hi["loss"].y) == ([0], [0.0], [9.0])
    assert s.take_fresh("loss") == {"lo": ([0], [0.0]), "hi": ([0], [9.0])}
    s.settle("loss", 1)
    assert s.hi["loss"].y == [9.0, 18.0] and s.outliers("loss") == []
