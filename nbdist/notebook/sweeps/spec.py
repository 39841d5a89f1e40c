"""What a sweep tries: the swept names, their values or ranges, and the trials drawn from them.

``%%distributed --sweep lr=0.1,0.01 --sweep width=32,64 --trial-size 1`` is a grid (every
combination, in order); ``--sweep lr=1e-4..1e-1:log --samples 8 --seed 0`` draws 8 random
combinations (a range is uniform, or log-uniform with ``:log``; whole-number ends draw whole
numbers; listed values are drawn from evenly). Values are Python literals (``0.1``, ``'adam'``,
``(64, 64)``); a bare word is a string. Everything is checked here, at construction: a bad
sweep is one line before any engine runs anything.
"""

from __future__ import annotations

import ast
import itertools
import keyword
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import UsageError

#: Early-stopping rules ``--stop-early`` takes.
STOP_RULES = ("median",)


@dataclass(frozen=True)
class Range:
    """Values to draw from: uniform in [low, high], or log-uniform (``log``)."""

    low: float
    high: float
    log: bool = False

    def __post_init__(self) -> None:
        if not self.low < self.high:
            raise UsageError(f"a range must go from low to high, not {self}: write LOW..HIGH")
        if self.log and self.low <= 0:
            raise UsageError(f"a :log range needs positive ends, not {self.low}..{self.high}")

    @property
    def whole(self) -> bool:
        return isinstance(self.low, int) and isinstance(self.high, int)

    def draw(self, rng: random.Random) -> float | int:
        if self.whole:
            if self.log:
                return round(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))
            return rng.randint(self.low, self.high)
        if self.log:
            return math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        return rng.uniform(self.low, self.high)

    def __str__(self) -> str:
        return f"{self.low}..{self.high}" + (":log" if self.log else "")


def _literal(text: str) -> Any:
    text = text.strip()
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        if text.isidentifier():
            return text  # a bare word: a string
        raise UsageError(
            f"--sweep value {text!r} is not a Python literal: write numbers, 'strings' or "
            "tuples, separated by commas"
        ) from None


def parse_values(name: str, text: str) -> list | Range:
    """``VALUES`` of ``--sweep NAME=VALUES``: a list of literals, or ``LOW..HIGH[:log]``."""
    text = text.strip()
    if ".." in text and not text.startswith(("'", '"')):
        ends, _, flag = text.partition(":")
        low, _, high = ends.partition("..")
        if flag not in ("", "log"):
            raise UsageError(f"--sweep {name}={text}: a range ends with :log or nothing")
        lo, hi = _literal(low), _literal(high)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (lo, hi)):
            raise UsageError(f"--sweep {name}={text}: a range's ends must be numbers")
        return Range(lo, hi, flag == "log")
    if not text:
        raise UsageError(f"--sweep {name}= has no values: list them, e.g. {name}=0.1,0.01")
    try:
        values = ast.literal_eval(f"[{text}]")
    except (ValueError, SyntaxError):
        values = [_literal(part) for part in text.split(",")]
    if not values:
        raise UsageError(f"--sweep {name}= has no values: list them, e.g. {name}=0.1,0.01")
    return values


def parse_sweep(text: str) -> tuple[str, list | Range]:
    """One ``--sweep NAME=VALUES`` option."""
    name, eq, values = text.partition("=")
    name = name.strip()
    if not eq:
        raise UsageError(f"--sweep takes NAME=VALUES, such as lr=0.1,0.01, not {text!r}")
    _check_name(name)
    return name, parse_values(name, values)


def _check_name(name: str) -> None:
    if not name.isidentifier() or keyword.iskeyword(name):
        raise UsageError(
            f"--sweep name {name!r} is not a Python name: the cell sees it as a variable, so use "
            "letters, digits and _"
        )


def label(values: Mapping[str, Any]) -> str:
    """A trial's values as people read them: ``lr=0.1, width=32``."""
    return ", ".join(f"{k}={_short(v)}" for k, v in values.items())


def _short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else repr(v) if isinstance(v, str) else str(v)


@dataclass(frozen=True)
class SweepSpec:
    """A sweep, checked: ``params`` maps each swept name to its values (a list) or a ``Range``;
    ``samples`` (None: the grid) random combinations from ``seed``; each trial on
    ``trial_size`` ranks; ``stop_early`` a rule of ``STOP_RULES`` or None."""

    params: Mapping[str, Sequence | Range]
    trial_size: int
    samples: int | None = None
    seed: int = 0
    stop_early: str | None = None
    name: str = ""
    grace: int = field(default=5)  # reports a trial makes before the stopping rule judges it

    def __post_init__(self) -> None:
        if not self.params:
            raise UsageError("a sweep needs at least one --sweep NAME=VALUES")
        for name, values in self.params.items():
            _check_name(name)
            if not isinstance(values, Range) and not list(values):
                raise UsageError(f"--sweep {name} has no values: list at least one")
        for what, n in (("--trial-size", self.trial_size), ("--samples", self.samples)):
            if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
                raise UsageError(f"{what} must be a whole number >= 1, not {n!r}")
        ranges = [k for k, v in self.params.items() if isinstance(v, Range)]
        if self.samples is None and ranges:
            raise UsageError(
                f"--sweep {ranges[0]}={self.params[ranges[0]]} is a range: add --samples N to "
                "draw N trials from it, or list its values"
            )
        if self.samples is not None and not ranges:
            raise UsageError(
                "--samples draws from ranges, and every --sweep here lists values: give a "
                "range (lr=1e-4..1e-1:log), or drop --samples to try the whole grid"
            )
        if self.stop_early is not None and self.stop_early not in STOP_RULES:
            raise UsageError(
                f"unknown --stop-early rule {self.stop_early!r}: use {', '.join(STOP_RULES)}"
            )

    def check_cluster(self, ranks: int) -> None:
        """The trials must tile the cluster: one line naming the fix otherwise."""
        if self.trial_size > ranks or ranks % self.trial_size:
            sizes = [k for k in range(1, ranks + 1) if ranks % k == 0]
            raise UsageError(
                f"--trial-size {self.trial_size} does not divide the cluster's {ranks} ranks: "
                f"use one of {', '.join(map(str, sizes))}"
            )

    def trials(self) -> list[dict[str, Any]]:
        """Each trial's values, in trial order: the grid, or ``samples`` draws from ``seed``."""
        names = list(self.params)
        if self.samples is None:
            grid = itertools.product(*(list(self.params[n]) for n in names))
            return [dict(zip(names, combo, strict=True)) for combo in grid]
        rng = random.Random(self.seed)
        out = []
        for _ in range(self.samples):
            row = {}
            for n in names:
                v = self.params[n]
                row[n] = v.draw(rng) if isinstance(v, Range) else rng.choice(list(v))
            out.append(row)
        return out
