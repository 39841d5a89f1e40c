"""How a metric spreads over many ranks, for a chart that cannot draw a line per rank: at each
step the ranks' lowest and highest value (a band about their mean), and the outlier ranks, those
whose latest values stand far from the others' (drawn as lines of their own).

One rule for every place that draws many ranks: the kernel's board folds what the run's
observers are told (``notebook/board``), the Jupyter server what the run store holds (the
sidebar's run view, ``server/curves``). Each rank's values (``add``) and each settled mean
(``settle``: a step every live rank has passed, so its band is whole). Bounded as the curves
are: a band's curves are ``Curve``s, its steps still waiting at most ``_PENDING`` per metric.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping

from .curves import Curve, Outbox
from .events import MetricRecord
from .series import metric_values

#: Past this many ranks a chart draws each metric's mean, its band and its outliers, not a line
#: per rank (the board, its picture and the sidebar's run view alike).
MANY_RANKS = 8
OUTLIERS = 3  # outlier ranks drawn per metric, at most
_PENDING = 20_000  # steps of a metric waiting for their mean, at most
_ENTER = 3.5  # robust z-score (from the median and MAD) at which a rank becomes an outlier
_LEAVE = 2.0  # ... and below which it is one no more


def outliers_of(values: Mapping[int, float], were: Iterable[int] = ()) -> list[int]:
    """The ranks whose value stands far from the others' (a robust z-score from the median and
    MAD over ``_ENTER``; one of ``were`` stays an outlier until it falls under ``_LEAVE``), the
    farthest first, at most ``OUTLIERS``. Fewer than 4 ranks have none."""
    if len(values) < 4:
        return []
    median = statistics.median(values.values())
    mad = statistics.median(abs(v - median) for v in values.values())
    scale = 1.4826 * mad or 1e-12 * (abs(median) or 1.0)
    z = {r: abs(v - median) / scale for r, v in values.items()}
    was = set(were)
    chosen = [r for r, s in z.items() if s > (_LEAVE if r in was else _ENTER)]
    return sorted(chosen, key=lambda r: (-z[r], r))[:OUTLIERS]


class Spread:
    """Per metric: ``lo``/``hi`` curves of the ranks' lowest and highest value at each settled
    step, and each rank's latest value (``latest``), from which ``outliers`` are judged."""

    def __init__(self, limit: int = 2000):
        self.limit = limit
        self.lo: dict[str, Curve] = {}
        self.hi: dict[str, Curve] = {}
        self.latest: dict[str, dict[int, float]] = {}
        self._pending: dict[str, dict[float, list[float]]] = {}  # name -> step -> [lo, hi]
        self._fresh: dict[tuple[str, str], Outbox] = {}  # (name, "lo" | "hi") -> new points
        self._outliers: dict[str, list[int]] = {}

    def add(self, rank: int, records: Iterable[MetricRecord]) -> None:
        """One rank's records: its values at their steps."""
        for rec in records:
            self.add_values(rank, rec.step, metric_values(rec.loss, rec.extra))

    def add_values(self, rank: int, step: float | None, values: Mapping[str, float]) -> None:
        """One rank's finite values (``metric_values``) at ``step`` (None: no place on a step
        axis, left out)."""
        if step is None:
            return
        for name, y in values.items():
            self.latest.setdefault(name, {})[rank] = y
            waiting = self._pending.setdefault(name, {})
            got = waiting.get(step)
            if got is None:
                waiting[step] = [y, y]
                if len(waiting) > _PENDING:
                    del waiting[min(waiting)]
            elif y < got[0]:
                got[0] = y
            elif y > got[1]:
                got[1] = y

    def settle(self, name: str, step: float) -> None:
        """Every live rank has passed ``step`` (its mean settled): its band is whole."""
        got = self._pending.get(name, {}).pop(step, None)
        if got is None:
            return
        for side, y in zip(("lo", "hi"), got, strict=True):
            curves = self.lo if side == "lo" else self.hi
            if name not in curves:
                curves[name] = Curve(self.limit)
            curves[name].add(step, y)
            box = self._fresh.get((name, side))
            if box is None:
                box = self._fresh[name, side] = Outbox()
            box.add(step, y)

    def take_fresh(self, name: str) -> dict[str, tuple[list, list]]:
        """The band's points settled since the last take: ``{"lo": (xs, ys), "hi": ...}``."""
        out = {}
        for side in ("lo", "hi"):
            box = self._fresh.get((name, side))
            points = box.take() if box is not None else None
            if points is not None:
                out[side] = points
        return out

    def outliers(self, name: str) -> list[int]:
        """The ranks whose latest ``name`` stands far from the others' (``outliers_of``, the
        ranks judged so last time staying until they fall under ``_LEAVE``)."""
        chosen = outliers_of(self.latest.get(name, {}), self._outliers.get(name, ()))
        self._outliers[name] = chosen
        return chosen
