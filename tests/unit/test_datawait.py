"""The share of a rank's steps spent waiting for the next batch (``reporting.datawait``): on a
clock the test moves (whole steps, several per window, one longer than the window, an iterator's
end, nesting, another thread), on the real clock with a slow iterator, and in the health sample."""

from __future__ import annotations

import threading
import time
import types

import pytest

from nbdist.worker.reporting import datawait
from nbdist.worker.reporting.datawait import timed, waits


@pytest.fixture(autouse=True)
def fresh():
    waits.begin_cell()
    yield
    waits.begin_cell()


class Clock:
    """``perf_counter`` as the test moves it."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(datawait, "time", types.SimpleNamespace(perf_counter=c.perf_counter))
    return c


def slow(clock: Clock, waits_s: list[float]):
    """Batches 0, 1, ..., each after ``waits_s[i]`` seconds on ``clock``."""
    for i, w in enumerate(waits_s):
        clock.now += w
        yield i


def test_no_loader_is_none_and_a_new_cell_starts_afresh(clock):
    assert waits.share() is None and waits.waited() == 0.0
    it = timed(slow(clock, [1.0, 1.0]))
    next(it)
    clock.now += 1.0
    next(it)
    assert waits.share() == pytest.approx(2 / 3)  # the first batch's step is its wait alone
    waits.begin_cell()
    assert waits.share() is None and waits.waited() == 0.0


def test_a_window_of_several_steps_is_their_time_weighted_share(clock):
    it = timed(slow(clock, [0.1] * 6))
    next(it)
    waits.share()  # the window starts here, at the first batch
    for compute in (0.1, 0.3, 0.1):  # steps of 0.2, 0.4, 0.2 s, each waiting 0.1 s
        clock.now += compute
        next(it)
    assert waits.share() == pytest.approx(0.3 / 0.8)
    assert waits.waited() == pytest.approx(0.4)


def test_a_step_longer_than_the_window(clock):
    it = timed(slow(clock, [1.0, 0.0, 3.0]))
    next(it)
    assert waits.share() == 1.0  # the first batch: its step is all waiting
    clock.now += 1.0
    next(it)
    assert waits.share() == 0.0  # a whole step of no wait, just ended
    clock.now += 1.0  # computing, and nothing ended: the last whole steps' share
    assert waits.share() == 0.0
    waits.since, clock.now = clock.now, clock.now + 1.0  # waiting for a batch since 1 s ago
    assert waits.share() == pytest.approx(1 / 2)  # of the step so far (2 s), 1 s waited
    waits.since = None
    clock.now -= 1.0
    next(it)  # 3 s waited: the step of 4 s ends
    assert waits.share() == pytest.approx(3 / 4)


def test_an_iterators_end_counts_in_the_next_step(clock):
    first = timed(slow(clock, [0.0]))
    assert list(first) == [0]  # its end took no time on this clock: move it in the next one
    second = timed(slow(clock, [0.5, 0.5]))
    clock.now += 1.0
    next(second)
    assert waits.share() == pytest.approx(0.5 / 1.5)
    assert waits.totals[2] == 2


def test_nested_and_other_threads_count_once_or_not_at_all(clock):
    assert list(timed(timed(slow(clock, [1.0, 1.0])))) == [0, 1]
    assert waits.waited() == pytest.approx(2.0) and waits.totals[2] == 2
    waits.begin_cell()
    got = []
    t = threading.Thread(target=lambda: got.extend(timed(slow(clock, [1.0, 1.0]))))
    t.start()
    t.join()
    assert got == [0, 1] and waits.share() is None  # a prefetching thread: no step's wait


def test_a_slow_iterator_on_the_real_clock():
    def batches():
        for i in range(12):
            time.sleep(0.02)  # the loader: 20 ms per batch
            yield i

    it = timed(batches())
    next(it)
    waits.share()
    start = time.perf_counter()
    for _ in it:
        time.sleep(0.06)  # the step's compute: 60 ms
    assert 0.15 < waits.share() < 0.35  # about 20 / 80
    elapsed = time.perf_counter() - start
    assert waits.waited() == pytest.approx(12 * 0.02, abs=0.1) and elapsed > 11 * 0.08


def test_the_health_sample_carries_it(clock):
    from nbdist.worker.reporting.health import Health

    health = Health()
    health.begin_cell()
    assert health.sample().data_share is None
    it = timed(slow(clock, [0.25, 0.25]))
    next(it)
    clock.now += 0.75
    next(it)
    assert health.sample().data_share == pytest.approx(0.5 / 1.25)
