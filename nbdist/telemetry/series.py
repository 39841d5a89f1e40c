"""Every metric of a run, per rank and as the mean over ranks, in curves of bounded size.

A run reports ``loss`` and any other numbers (``report(acc=..., val_loss=...)``), each at its own
cadence. ``RunSeries`` keeps, per metric, a ``Curve`` per rank and one for the mean over ranks at
each step. A step's mean is settled once every rank still going has passed it, so it never
averages some of the ranks; a lagging rank holds back at most ``MAX_PENDING`` steps. Metrics
beyond ``MAX_METRICS`` are stored by the run store but not charted (their names are counted in
``dropped``): a run that reports a thousand names costs what one that reports fifty does.

The kernel's collector (live, for the board) and the Jupyter server (the sidebar's run views,
read back from the run store) fold records through this one class, so both draw the same curves.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from .curves import Curve, Outbox

MAX_METRICS = 50  # metrics charted per run
MAX_PENDING = 20_000  # steps whose mean may wait for a lagging rank, per metric


def metric_values(loss: Any, extra: Mapping[str, Any] | None) -> dict[str, float]:
    """A record's finite numbers by name, ``loss`` first: what gets a curve."""
    out: dict[str, float] = {}
    for name, value in (("loss", loss), *((extra or {}).items())):
        if value is None or isinstance(value, str):
            continue
        try:
            v = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(v):
            out.setdefault(str(name), v)
    return out


class RunSeries:
    """Curves of every metric of one run: ``ranks[name][rank]`` and ``mean[name]``.

    ``add()`` takes one rank's values at a step; ``settle()`` folds the steps every rank has
    passed into the means, and lists the points it settled when asked (TensorBoard and the
    trackers get them). Once ``keep_fresh()`` is called, the points added since are also kept
    apart, for ``take_fresh()`` (a live board sends them to the browser), in outboxes bounded
    as the curves are.
    """

    def __init__(self, limit: int = 2000, max_metrics: int = MAX_METRICS):
        self.limit = limit
        self.max_metrics = max_metrics
        self.names: list[str] = []  # in the order first reported
        self.ranks: dict[str, dict[int, Curve]] = {}
        self.mean: dict[str, Curve] = {}
        self.dropped = 0  # names past max_metrics, not charted
        self._dropped: set[str] = set()  # bounded by the check below
        self._sums: dict[str, dict[int, list[float]]] = {}  # name -> step -> [sum, count]
        self.latest: dict[int, int] = {}  # rank -> its latest step
        # points not yet taken (keep_fresh): (name, rank) -> Outbox; (name, None): the mean's
        self._fresh: dict[tuple[str, int | None], Outbox] | None = None

    # -- input ------------------------------------------------------------------------------
    def add(self, rank: int, step: int | None, values: Mapping[str, float]) -> None:
        """One rank's finite values (``metric_values``) at ``step``; a record without a step
        has no place on a step axis and is left out."""
        if step is None:
            return
        fresh = self._fresh
        if step > self.latest.get(rank, -math.inf):
            self.latest[rank] = step
        for name, y in values.items():
            curves = self.ranks.get(name)
            if curves is None:
                if not self._admit(name):
                    continue
                curves = self.ranks[name]
            curve = curves.get(rank)
            if curve is None:
                curve = curves[rank] = Curve(self.limit)
            curve.add(step, y)
            acc = self._sums[name].get(step)
            if acc is None:
                acc = self._sums[name][step] = [0.0, 0]
            acc[0] += y
            acc[1] += 1
            if fresh is not None:
                box = fresh.get((name, rank))
                if box is None:
                    box = fresh[name, rank] = Outbox()
                box.add(step, y)

    def _admit(self, name: str) -> bool:
        if len(self.names) >= self.max_metrics:
            if name not in self._dropped and len(self._dropped) < 10 * self.max_metrics:
                self._dropped.add(name)
                self.dropped += 1
            return False
        self.names.append(name)
        self.ranks[name] = {}
        self.mean[name] = Curve(self.limit)
        self._sums[name] = {}
        return True

    # -- the means --------------------------------------------------------------------------
    def settle(
        self,
        upto: float | None = None,
        final: bool = False,
        into: list[tuple[str, float, float]] | None = None,
    ) -> None:
        """Fold each metric's steps up to ``upto`` (default: the step every rank has passed;
        every step when ``final``) into its mean, in step order; the points settled are added
        to ``into``, when given, as ``(name, step, mean)``."""
        if upto is None:
            upto = min(self.latest.values(), default=-math.inf)
        for name, sums in self._sums.items():
            if not sums:
                continue
            steps = sorted(sums)
            limit = math.inf if final else upto
            if len(steps) > MAX_PENDING:
                limit = max(limit, steps[len(steps) - MAX_PENDING])
            mean = self.mean[name]
            for step in steps:
                if step > limit:
                    break
                total, count = sums.pop(step)
                done = mean.last_x()
                if done is not None and step <= done:
                    continue  # a late report for a step already settled
                value = total / count
                mean.add(step, value)
                if self._fresh is not None:
                    box = self._fresh.get((name, None))
                    if box is None:
                        box = self._fresh[name, None] = Outbox()
                    box.add(step, value)
                if into is not None:
                    into.append((name, step, value))

    def keep_fresh(self) -> None:
        """From now on, keep the points added apart too, for ``take_fresh``."""
        if self._fresh is None:
            self._fresh = {}

    def take_fresh(self) -> dict[str, dict[int | None, tuple[list, list]]]:
        """The points added (and means settled) since the last take, by metric, then by rank
        (None: the mean): ``(xs, ys)``, decimated when many. Empties them."""
        out: dict[str, dict[int | None, tuple[list, list]]] = {}
        for (name, rank), box in (self._fresh or {}).items():
            points = box.take()
            if points is not None:
                out.setdefault(name, {})[rank] = points
        return out

    def mean_view(self, name: str) -> tuple[list[float], list[float]]:
        """The mean's settled points and, after them, the steps still waiting (their mean so
        far): the whole run's curve as it stands."""
        mean = self.mean.get(name)
        if mean is None:
            return [], []
        xs, ys = mean.x, mean.y
        waiting = sorted(self._sums.get(name, {}).items())
        last = xs[-1] if xs else -math.inf
        xs += [s for s, _ in waiting if s > last]
        ys += [t / n for s, (t, n) in waiting if s > last]
        return xs, ys

    def last(self, name: str) -> float | None:
        """The latest settled mean of ``name``."""
        mean = self.mean.get(name)
        return mean.last() if mean is not None else None


def fold_rows(series: RunSeries, rows: Iterable[Mapping[str, Any]]) -> None:
    """Run-store metric rows (``rank``, ``step``, ``loss``, ``extra``) into ``series``."""
    for row in rows:
        series.add(row["rank"], row["step"], metric_values(row["loss"], row.get("extra")))
