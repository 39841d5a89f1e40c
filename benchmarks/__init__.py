"""nbdist's benchmarks: each figure is a ratio against a baseline measured in the same run.

Run them all with ``python -m benchmarks`` (``--tiny`` for a quick, meaningless-size pass, as the
smoke test does; ``--only train,start`` for some). They are not timed tests: the machine they run
on decides the figures, so compare the ratios, and re-run on a quiet machine before quoting them.

The protocol a benchmark module follows, so that ``python -m benchmarks`` can run it:

``run(tiny: bool = False) -> list[Result]``
    Measure, with the baseline in the same run, and return one ``Result`` per figure. ``tiny``
    asks for the smallest sizes that still run every code path (for the smoke test).

A module without ``run`` is run as a script (``python -m benchmarks.NAME``) and its output is
shown as it is (full runs only). Result-like dicts (``name``, ``value``, ``baseline``...) and
objects with those attributes are accepted too.
"""

from __future__ import annotations

import contextlib
import operator
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

_OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}


@dataclass(frozen=True)
class Result:
    """One figure: what nbdist measured, what the baseline measured, in the same run."""

    name: str
    """What is compared, e.g. "train mlp: %%distributed / torchrun"."""
    value: float
    """nbdist's measurement."""
    baseline: float
    """The baseline's measurement, same unit."""
    unit: str = ""
    """Unit of ``value`` and ``baseline`` (samples/s, s, MB/s...)."""
    target: str = ""
    """The ratio wanted, as ``">= 0.98"`` or ``"< 0.5"``; empty when there is none."""
    note: str = ""

    @property
    def ratio(self) -> float:
        """``value / baseline``."""
        return self.value / self.baseline if self.baseline else float("nan")

    @property
    def met(self) -> bool | None:
        """Whether the ratio meets the target (None without a target)."""
        if not self.target:
            return None
        op, threshold = self.target.split()
        return _OPS[op](self.ratio, float(threshold))


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def threads_each(workers: int) -> int:
    """Each of ``workers`` processes' share of the cores, so together they fill the machine
    without oversubscribing it."""
    return max(1, cores() // workers)


def _fmt(x: float) -> str:
    if x != x:  # nan
        return "-"
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def table(results: list[Result]) -> str:
    """The results as a plain-text table (also valid Markdown)."""
    head = ["benchmark", "nbdist", "baseline", "unit", "ratio", "target", ""]
    rows = [
        [
            r.name,
            _fmt(r.value),
            _fmt(r.baseline),
            r.unit,
            f"{r.ratio:.3f}" if r.ratio == r.ratio else "-",
            r.target,
            {None: "", True: "met", False: "MISSED"}[r.met] + (f" {r.note}" if r.note else ""),
        ]
        for r in results
    ]
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows, strict=True)]

    def line(cells: list) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(head), sep, *(line(r) for r in rows)])


@contextlib.contextmanager
def environ(name: str, value: str | None) -> Iterator[None]:
    """``os.environ[name]`` set to ``value`` (None: left as it is) in this process and what it
    starts, then put back as it was."""
    old = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


@contextlib.contextmanager
def private_data_dir(prefix: str) -> Iterator[str]:
    """``NBDIST_DATA_DIR`` set to a fresh temporary folder (this process and the clusters it
    starts keep their records there, never the user's), then put back and removed."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp, environ("NBDIST_DATA_DIR", tmp):
        yield tmp
