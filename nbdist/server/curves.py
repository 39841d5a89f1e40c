"""A run's curves for the sidebar, folded from the run store, small whatever the run's length.

The sidebar's card and run views ask for every metric's curve (the mean over ranks, and each
rank's when asked) and each rank's health over time, cut to a few hundred points. A run of a
million metric rows must cost what a run of a thousand does, on every poll of a live run:

- the rows are folded once, into a ``RunSeries`` (``telemetry.series``, the class the kernel's
  board folds with, so both draw the same curves) and ``HealthCurves``, kept per run in a small
  cache (``SeriesCache``, the least recently used run leaves first);
- each request reads only the rows added since the last one (``since_id``), in pages of plain
  tuples (``RunStore.metric_points``: little for the server's garbage collector to walk), and
  folds for at most ``budget`` seconds: the first read of a long run is bounded in memory and time,
  and says ``complete: false`` until it has caught up (the sidebar asks again at once);
- what is sent is decimated (``curves.minmax``) to at most ``points`` per line, and the per-rank
  lines of a wide run (a metric's, or the health measures') share a budget of ``MAX_SENT``
  points in all;
- past ``MANY_RANKS`` ranks a metric's per-rank lines are its band (the ranks' lowest and highest
  at each settled step) and its outlier ranks' lines alone, named (``telemetry.spread``, the
  rule the kernel's board draws by): what is sent does not grow with the ranks.

Called on the server's reader threads: each run's entry has a lock of its own, so two requests
for one run fold its rows once.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..telemetry.curves import Curve, minmax
from ..telemetry.series import RunSeries, metric_values
from ..telemetry.spread import MANY_RANKS, Spread
from ..telemetry.store import RunStore

#: The most points per line a request may ask for (the folded curves keep this many).
MAX_POINTS = 2000
#: The most points of per-rank lines in one answer, all metrics and ranks together.
MAX_SENT = 200_000
#: Health measures kept over time, as the store's health history has them.
MEASURES = ("cpu", "rss", "gpu_util", "gpu_mem", "step_time", "comm_share", "data_share")
#: State changes kept per rank (the latest ones).
MAX_CHANGES = 200


def _line(xs: list[float], ys: list[float], points: int) -> dict[str, list[float]]:
    """``xs, ys`` in at most about ``points`` points (their envelope), the first and the last
    kept whatever they are: the card labels them."""
    x, y = minmax(xs, ys, max(1, (points - 2) // 2))
    if xs and x[0] != xs[0]:
        x, y = [xs[0], *x], [ys[0], *y]
    if xs and x[-1] != xs[-1]:
        x, y = [*x, xs[-1]], [*y, ys[-1]]
    return {"x": x, "y": y}


class HealthCurves:
    """Each rank's measures over time (seconds since the run started) and its state changes."""

    def __init__(self, started: float, limit: int = MAX_POINTS):
        self.started = started
        self.limit = limit
        self.curves: dict[int, dict[str, Curve]] = {}
        self.changes: dict[int, deque] = {}  # rank -> (t, state) at each change
        self.last: dict[int, float] = {}  # rank -> the time of its latest sample

    def add(self, row: dict[str, Any]) -> None:
        rank, t = int(row["rank"]), float(row["time"]) - self.started
        # a rank's samples in the order recorded: a final row stamped with the engine's last
        # sample time may say earlier than the one before it, and a line's x never goes back
        t = max(t, self.last.get(rank, t))
        self.last[rank] = t
        curves = self.curves.setdefault(rank, {})
        for name in MEASURES:
            v = row.get(name)
            if isinstance(v, (int, float)):
                curve = curves.get(name)
                if curve is None:
                    curve = curves[name] = Curve(self.limit)
                curve.add(t, float(v))
        changes = self.changes.setdefault(rank, deque(maxlen=MAX_CHANGES))
        if not changes or changes[-1][1] != row["state"]:
            changes.append((t, str(row["state"])))

    def view(self, points: int) -> list[dict[str, Any]]:
        out = []
        for rank in sorted(self.curves):
            measures = {n: _line(c.x, c.y, points) for n, c in self.curves[rank].items()}
            changes = [list(c) for c in self.changes.get(rank, ())]
            out.append({"rank": rank, "measures": measures, "states": changes})
        return out


class _Entry:
    """One run's folded rows, how far they go, and the lock that guards them."""

    def __init__(self, folded: Any):
        self.folded = folded
        self.last_id = 0
        self.rows = 0
        self.first_step: float | None = None
        self.final = False  # the run has ended and every row of it is folded
        self.lock = threading.Lock()


class SeriesCache:
    """Folded curves of the last ``runs`` runs asked about, brought up to date at each ask."""

    def __init__(self, runs: int = 16, page: int = 5000, budget: float = 0.5):
        self.runs = runs
        self.page = page
        self.budget = budget
        self._entries: dict[str, OrderedDict[tuple, _Entry]] = {}
        self._lock = threading.Lock()

    def size(self) -> int:
        """How many runs' curves are kept (of each kind: metrics, health)."""
        with self._lock:
            return max((len(kept) for kept in self._entries.values()), default=0)

    def _entry(self, kind: str, store: RunStore, run: dict, make: Callable[[], Any]) -> _Entry:
        """The entry of ``kind`` for ``run`` (made if new; the oldest of its kind leaves)."""
        key = (str(Path(store.path).resolve()), run["id"], run["started"])
        with self._lock:
            kept = self._entries.setdefault(kind, OrderedDict())
            entry = kept.get(key)
            if entry is None:
                entry = kept[key] = _Entry(make())
                while len(kept) > self.runs:
                    kept.popitem(last=False)
            kept.move_to_end(key)
            return entry

    def _catch_up(
        self,
        entry: _Entry,
        read: Callable[[int, int], list[dict]],
        fold: Callable[[list[dict]], None],
        ended: bool,
    ) -> bool:
        """Read and fold the rows after ``entry.last_id``, a page at a time, for at most
        ``budget`` seconds. True once a short page says every row there is now is folded
        (``final`` too when the run has ended: no more rows will come)."""
        deadline = time.monotonic() + self.budget
        while not entry.final:
            page = read(entry.last_id, self.page)
            if page:
                fold(page)
                last = page[-1]
                entry.last_id = last[0] if isinstance(last, tuple) else last["id"]
                entry.rows += len(page)
            if len(page) < self.page:
                entry.final = ended
                return True
            if time.monotonic() > deadline:
                return False
        return True

    def curves(
        self,
        store: RunStore,
        run: dict[str, Any],
        points: int,
        ranks: bool = False,
        names: list[str] | None = None,
    ) -> dict[str, Any]:
        """Every metric's mean (and each rank's line when ``ranks``) of ``run``, decimated to
        ``points``; only the metrics in ``names`` when given (the names are always all)."""
        ended = run["status"] != "running"
        entry = self._entry("metrics", store, run, lambda: (RunSeries(), Spread(MAX_POINTS)))
        with entry.lock:
            series: RunSeries
            spread: Spread
            series, spread = entry.folded

            def fold(rows: list[tuple]) -> None:
                first = entry.first_step
                for _, rank, step, loss, extra in rows:
                    values = metric_values(loss, json.loads(extra) if extra else None)
                    series.add(rank, step, values)
                    spread.add_values(rank, step, values)
                    if step is not None and (first is None or step < first):
                        first = step
                entry.first_step = first

            def read(since: int, limit: int) -> list[tuple]:
                return store.metric_points(run["id"], since, limit)

            complete = self._catch_up(entry, read, fold, ended)
            settled: list[tuple[str, float, float]] = []
            series.settle(final=entry.final, into=settled)
            for name, step, _ in settled:
                spread.settle(name, step)
            chosen = [n for n in series.names if names is None or n in names]
            many = ranks and max(run.get("world_size") or 0, len(series.latest)) > MANY_RANKS
            shown = {n: _shown(series, spread, n, many) for n in chosen} if ranks else {}
            wide = sum(len(r) for r in shown.values())
            per_rank = min(points, MAX_SENT // wide) if wide else 0
            metrics = []
            for name in chosen:
                curves = series.ranks[name]
                lines = [
                    {"rank": r, **_line(curves[r].x, curves[r].y, per_rank)}
                    for r in shown.get(name, ())
                ]
                metric = {
                    "name": name,
                    "mean": _line(*series.mean_view(name), points),
                    "ranks": lines,
                }
                if many:
                    metric.update(_band(spread, name, len(curves), points), outliers=shown[name])
                metrics.append(metric)
            return {
                "run_id": run["id"],
                "names": list(series.names),
                "metrics": metrics,
                "done": _done(series, entry.first_step),
                "rows": entry.rows,
                "complete": complete,
                "dropped": series.dropped,
            }

    def health(self, store: RunStore, run: dict[str, Any], points: int) -> dict[str, Any]:
        """Each rank's health measures over time and its state changes, decimated to
        ``points`` per line."""
        ended = run["status"] != "running"
        entry = self._entry("health", store, run, lambda: HealthCurves(run["started"]))
        with entry.lock:
            folded: HealthCurves = entry.folded

            def fold(rows: list[dict]) -> None:
                for row in rows:
                    folded.add(row)

            def read(since: int, limit: int) -> list[dict]:
                return store.health_history(run["id"], since, limit)

            complete = self._catch_up(entry, read, fold, ended)
            lines = sum(len(measures) for measures in folded.curves.values())
            return {
                "run_id": run["id"],
                "started": run["started"],
                "measures": list(MEASURES),
                "ranks": folded.view(min(points, MAX_SENT // lines) if lines else points),
                "rows": entry.rows,
                "complete": complete,
            }


def _shown(series: RunSeries, spread: Spread, name: str, many: bool) -> list[int]:
    """The ranks whose own line is sent: every rank's of a few ranks; past ``MANY_RANKS``, the
    outliers' only, the farthest first."""
    return spread.outliers(name) if many else sorted(series.ranks[name])


def _band(spread: Spread, name: str, ranks: int, points: int) -> dict[str, Any]:
    """``name``'s band over its ``ranks`` (none until a step of it has settled), decimated to
    ``points`` a side."""
    lo, hi = spread.lo.get(name), spread.hi.get(name)
    if lo is None or hi is None:
        return {"band": None}
    return {
        "band": {"lo": _line(lo.x, lo.y, points), "hi": _line(hi.x, hi.y, points), "ranks": ranks}
    }


def _done(series: RunSeries, first_step: float | None) -> int | None:
    """Steps completed by the slowest reporting rank, counting from 1: the run's ``step`` as
    the kernel's collector counts it (``Collector.done``), from the rows read so far."""
    if not series.latest:
        return None
    return int(min(series.latest.values())) + (1 if first_step == 0 else 0)
