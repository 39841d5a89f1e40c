"""The sweep's stopping rule and the loss histories it reads: right, and as cheap at the
millionth report as at the tenth."""

from __future__ import annotations

import time

import pytest

from nbdist.notebook.sweeps.stopping import LossHistory, median_rule


def _trial(i: int, losses: list[float]) -> LossHistory:
    h = LossHistory()
    for step, loss in enumerate(losses):
        h.add(step, loss)
    return h


def test_the_median_rule_stops_a_trial_worse_than_the_median_of_the_others():
    good, mid, bad = _trial(0, [1.0] * 10), _trial(1, [2.0] * 10), _trial(2, [3.0] * 6)
    why = median_rule(bad, [good, mid], grace=5)
    assert why == ("stopped at step 5: mean loss 3, worse than the median 1.5 of 2 other trials")
    assert median_rule(good, [mid, bad], grace=5) is None  # better than the median
    assert median_rule(bad, [good], grace=5) is None  # one other trial is not a median
    assert median_rule(_trial(3, [9.0] * 4), [good, mid], grace=5) is None  # within its grace
    # others that have not reached the step do not count
    assert median_rule(bad, [_trial(4, [0.1] * 3), _trial(5, [0.1] * 3)], grace=5) is None


def test_a_history_keeps_the_latest_the_best_and_exact_means_while_short():
    h = _trial(0, [4.0, 2.0, 3.0, 1.0])
    assert (h.last, h.last_step, h.best, h.reports) == (1.0, 3, 1.0, 4)
    assert [h.mean_to(s) for s in (-1, 0, 1, 2, 3, 99)] == [None, 4.0, 3.0, 3.0, 2.5, 2.5]


def test_a_restart_replaces_what_was_reported_past_the_step_it_went_back_to():
    h = _trial(0, [1.0, 1.0, 9.0, 9.0])  # steps 0-3; then the run resumes from step 2
    h.add(2, 1.0)
    h.add(3, 1.0)
    assert h.mean_to(3) == 1.0 and h.reports == 6 and h.best == 1.0


def test_a_million_reports_keep_a_bounded_history_and_a_near_mean():
    h = LossHistory()
    for step in range(1_000_000):
        h.add(step, float(step % 100))
    assert len(h) <= h.limit
    assert h.mean_to(999_999) == pytest.approx(49.5)  # the latest: exact
    assert h.mean_to(500_000) == pytest.approx(49.5, abs=0.5)  # within a kept step of it
    others = [_trial(i, [1.0] * 10) for i in range(3)]
    t0 = time.perf_counter()
    for _ in range(1000):
        median_rule(h, others, grace=5)
    assert time.perf_counter() - t0 < 0.5  # a look costs microseconds, not a rescan
