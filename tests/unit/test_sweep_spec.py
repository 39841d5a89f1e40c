"""Sweeps as specified: the grid, random draws from ranges, the median stopping rule, and every
bad sweep as one line naming the fix (checked before any engine runs anything)."""

from __future__ import annotations

import math

import pytest

from nbdist.errors import UsageError
from nbdist.notebook.arguments import parse as _parse
from nbdist.notebook.magics import _distributed_parser, _sweep_spec
from nbdist.notebook.sweeps.spec import Range, SweepSpec, label, parse_sweep


def _spec(line: str) -> SweepSpec | None:
    return _sweep_spec(_parse(_distributed_parser(), line))


def test_a_grid_is_every_combination_in_order():
    spec = _spec("--sweep lr=0.1,0.01 --sweep opt=adam,'sgd' --sweep hidden=(8,8),(16,)")
    assert spec.trial_size == 1 and spec.samples is None
    trials = spec.trials()
    assert len(trials) == 8
    assert trials[0] == {"lr": 0.1, "opt": "adam", "hidden": (8, 8)}
    assert trials[-1] == {"lr": 0.01, "opt": "sgd", "hidden": (16,)}
    assert label(trials[0]) == "lr=0.1, opt='adam', hidden=(8, 8)"


def test_samples_draw_from_ranges_reproducibly():
    spec = _spec(
        "--sweep lr=1e-4..1e-1:log --sweep width=16..64 --sweep act=relu,tanh "
        "--samples 50 --seed 3 --trial-size 2 --stop-early median"
    )
    trials = spec.trials()
    assert trials == spec.trials() and len(trials) == 50  # the same draws from the same seed
    assert trials != SweepSpec(spec.params, 2, 50, seed=4).trials()
    assert all(1e-4 <= t["lr"] <= 1e-1 for t in trials)
    assert all(isinstance(t["width"], int) and 16 <= t["width"] <= 64 for t in trials)
    assert {t["act"] for t in trials} == {"relu", "tanh"}
    logs = sorted(math.log10(t["lr"]) for t in trials)  # log-uniform: decades evenly covered
    assert logs[0] < -3.4 and logs[-1] > -1.6
    assert spec.stop_early == "median" and spec.trial_size == 2


BAD = [
    ("--sweep 2lr=0.1", "--sweep name '2lr' is not a Python name"),
    ("--sweep lr=", "--sweep lr= has no values: list them, e.g. lr=0.1,0.01"),
    ("--sweep lr", "--sweep takes NAME=VALUES, such as lr=0.1,0.01, not 'lr'"),
    ("--sweep lr=0.1 --samples 4", "--samples draws from ranges, and every --sweep here lists"),
    ("--sweep lr=1e-4..1e-1", "--sweep lr=0.0001..0.1 is a range: add --samples N"),
    ("--sweep lr=1..0 --samples 2", "a range must go from low to high"),
    ("--sweep lr=0..1:log --samples 2", "a :log range needs positive ends"),
    ("--sweep lr=1,2 --stop-early mean", "unknown --stop-early rule 'mean': use median"),
    ("--sweep lr=1,2 --sweep lr=3", "each name takes one --sweep"),
    ("--trial-size 2", "--trial-size belongs to a sweep: add --sweep NAME=VALUES"),
    ("--sweep lr=a+b", "--sweep value 'a+b' is not a Python literal"),
]


@pytest.mark.parametrize(("line", "message"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_sweep_is_one_line(line, message):
    with pytest.raises(UsageError) as e:
        _spec(line)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_trial_size_must_divide_the_cluster():
    spec = SweepSpec({"lr": [1, 2]}, trial_size=3)
    with pytest.raises(
        UsageError, match="--trial-size 3 does not divide the cluster's 4 ranks: use one of 1, 2, 4"
    ):
        spec.check_cluster(4)
    spec.check_cluster(6)


def test_no_sweep_options_is_a_plain_cell():
    assert _spec("--name x") is None


def test_a_range_draws_whole_numbers_between_whole_ends():
    import random

    r = Range(2, 5)
    assert {r.draw(random.Random(s)) for s in range(200)} == {2, 3, 4, 5}
    assert parse_sweep("n=2..5") == ("n", Range(2, 5))
