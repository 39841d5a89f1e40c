"""The arithmetic of which samples each rank and loader worker reads (``worker.data.plan``):
every sample once per epoch, equal parts, and a resume that hands out exactly what an
uninterrupted epoch would have, whatever the counts."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from nbdist.worker.data import plan


def _handed_out(runs: list[plan.Run]) -> list[int]:
    """The batches in the order torch's DataLoader hands them out: round robin over runs."""
    lengths = [r.stop - r.start for r in runs]
    return [runs[w].start + t for w, t in plan.handed_out_order(lengths)]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 60), st.integers(1, 6), st.data())
def test_a_resumed_epoch_hands_out_exactly_the_rest(batches, workers, data):
    whole = _handed_out(plan.runs(batches, workers))
    assert sorted(whole) == list(range(batches))
    done = data.draw(st.integers(0, batches))
    assert _handed_out(plan.resume_runs(batches, workers, done)) == whole[done:]


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 200),
    st.integers(1, 7),
    st.integers(0, 8),
    st.integers(1, 9),
    st.booleans(),
    st.integers(1, 4),
)
def test_a_new_world_gets_the_rest_of_the_epoch_no_sample_twice(
    rows, world, done, batch_size, drop_last, workers
):
    domain = [(0, rows)]
    parts = [plan.rank_part(domain, world, r) for r in range(world)]
    assert len({plan.length(p) for p in parts}) == 1  # the same number of samples everywhere
    assert set().union(*(plan.positions(p).tolist() for p in parts)) == set(range(rows))
    seen: set[int] = set()
    for part in parts:
        n = plan.batch_count(plan.length(part), batch_size, drop_last)
        got = _handed_out(plan.runs(n, workers))[: min(done, n)]
        where = plan.positions(part)
        seen |= {int(p) for j in got for p in where[j * batch_size : (j + 1) * batch_size]}
    rest = plan.remaining(domain, world, done, batch_size, drop_last, workers)
    assert set(plan.positions(rest).tolist()) == set(range(rows)) - seen
    assert plan.length(rest) == len(set(plan.positions(rest).tolist()))  # no position twice


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(1, 40), min_size=1, max_size=8),
    st.integers(1, 50),
    st.booleans(),
    st.integers(0, 3),
)
def test_an_epochs_order_puts_every_sample_at_one_position(sizes, window, shuffle, epoch):
    order = plan.Epoch(tuple(sizes), shuffle, 7, epoch, window)
    blocks, rows = order.samples(np.arange(order.total))
    pairs = set(zip(blocks.tolist(), rows.tolist(), strict=True))
    assert pairs == {(b, r) for b, n in enumerate(sizes) for r in range(n)}
    again = plan.Epoch(tuple(sizes), shuffle, 7, epoch, window).samples(np.arange(order.total))
    assert all((a == b).all() for a, b in zip((blocks, rows), again, strict=True))


def test_shuffled_epochs_differ_and_windows_mix_blocks():
    order = plan.Epoch((100,) * 20, True, 0, 0, 400)
    blocks, _ = order.samples(np.arange(64))
    assert len(set(blocks.tolist())) > 1  # one batch draws from several blocks
    other = plan.Epoch((100,) * 20, True, 0, 1, 400).samples(np.arange(64))[0]
    assert not (other == blocks).all()
