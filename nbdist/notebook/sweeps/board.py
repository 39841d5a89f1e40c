"""The live board of a hyperparameter sweep: the kernel's half (issue 17).

The sweep's loop drives it: ``set_trial`` for a row of the trials table, ``add_points`` for new
points of one of a trial's curves (each metric its main rank reports, and ``RATE``, its
samples/s), ``update`` often (it sends at most about four times a second unless forced) and
``finish`` once. The browser draws it (``board.widget.SweepWidget``, an anywidget built from
``extension/src/boards/``): a chart per metric with one curve per trial, coloured by trial, and
the table.

As the run dashboard does (``board.dashboard.Dashboard``), the kernel sends only what changed, as
one custom message per update (points appended to each trial's curves, the rows that changed),
and keeps ``history``, a decimated copy of everything, refreshed every few seconds and at the
end, where a view that appears later starts. Curves are ``board.curves.Curve`` (bounded, min/max
buckets; at most ``MAX_METRICS`` metrics), so a trial of a million steps costs what one of a
thousand does. When the sweep ends the output keeps the widget and gains one static PNG of the
board (``picture``), for renderers without widgets. When no front end draws the board
(``board.widget.live``: papermill, ``jupyter nbconvert --execute``) there is no widget: a line
of text until the end, then the picture; the trials' points are still kept (the picture draws
them), and nothing is sent.

Everything sent is plain data: numbers finite or None (a NaN loss travels as the text "nan"),
text from engines and users sent as text; the browser sets it with ``textContent``.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from ...telemetry.curves import Curve, Outbox, decimated
from ...telemetry.series import MAX_METRICS
from ..board.shown import number
from . import picture

STATES = ("queued", "running", "done", "failed", "stopped")
RATE = "samples/s"  # the name of a trial's throughput curve
_SEND_EVERY = 0.25  # seconds between updates that are not forced
_HISTORY_EVERY = 5.0  # seconds between refreshes of the late views' starting point
_HISTORY_POINTS = 4000  # points per history and chart, shared among the trials' curves
_CURVE_POINTS = 2000  # points kept per trial and curve


def _loss(x: Any) -> float | str | None:
    """A latest loss as JSON carries it: a finite number, "nan"/"inf"/"-inf" as text, or None."""
    if x is None or isinstance(x, bool):
        return None
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else str(f)


_last: SweepBoard | None = None


def last() -> SweepBoard | None:
    """The sweep board shown last in this kernel, or None."""
    return _last


class SweepBoard:
    """The state of one sweep's board, and what of it the browser has not seen yet."""

    def __init__(self, title: str) -> None:
        self.title = str(title)
        self.status = "running"
        self.widget: Any = None
        self.seq = 0
        self.live: bool | None = None  # a widget updated while the sweep runs (set by show)
        self.messages = 0  # messages sent to the browser: deltas and histories
        self.sent_bytes = 0  # what the kernel sent the browser (tests read it)
        self.rows: list[dict] = []  # the table as data, by trial id
        self._handle: Any = None
        self.clock = time.monotonic  # seconds; tests replace it
        self._started = self.clock()
        self._ended: float | None = None  # when finish() was called: the elapsed time stops
        self._rows: dict[int, dict] = {}
        self._rows_sent: dict[int, dict] = {}
        self._curves: dict[str, dict[int, Curve]] = {"loss": {}, RATE: {}}  # metric -> trial
        self._out: dict[str, dict[int, Outbox]] = {"loss": {}, RATE: {}}
        self._last_send = -math.inf
        self._last_history = -math.inf

    # -- feeding ------------------------------------------------------------------------------
    def set_trial(
        self,
        trial: int,
        *,
        label: str,
        state: str,
        ranks: str = "",
        step: int | None = None,
        loss: float | None = None,
        best: float | None = None,
        samples_per_s: float | None = None,
        note: str = "",
    ) -> None:
        """Set one row of the trials table (replacing the trial's previous row)."""
        if state not in STATES:
            raise ValueError(f"a trial's state is one of {', '.join(STATES)}, not {state!r}")
        row = {
            "trial": int(trial),
            "label": str(label),
            "state": state,
            "ranks": str(ranks),
            "step": None if step is None else int(step),
            "loss": _loss(loss),
            "best": number(best),
            "samples_per_s": number(samples_per_s),
            "note": str(note),
        }
        if self._rows.get(row["trial"]) != row:  # the runner sets every row at every update
            self._rows[row["trial"]] = row
            self.rows = [self._rows[t] for t in sorted(self._rows)]

    def add_points(self, trial: int, name: str, steps: list[int], values: list[Any]) -> None:
        """New points of ``trial``'s curve of ``name`` (a metric, or ``RATE``), at increasing
        steps; values that are not finite numbers are left out. Metrics past ``MAX_METRICS``
        are not charted."""
        trial = int(trial)
        if name not in self._curves:
            if len(self._curves) >= MAX_METRICS + 1:  # + the rate
                return
            self._curves[name], self._out[name] = {}, {}
        curve = self._curves[name].setdefault(trial, Curve(_CURVE_POINTS))
        box = self._out[name].setdefault(trial, Outbox())
        for x, y in zip(steps, values, strict=True):
            y = number(y)
            if y is not None:
                curve.add(x, y)
                box.add(x, y)

    def add_reports(
        self, trial: int, points: list[tuple[str, int, float]], rate: float | None
    ) -> None:
        """A trial's new ``(metric, step, value)`` points, in step order, and its samples/s
        now (drawn at the last of their steps)."""
        by_name: dict[str, tuple[list, list]] = {}
        for name, step, value in points:
            steps, values = by_name.setdefault(name, ([], []))
            steps.append(step)
            values.append(value)
        for name, (steps, values) in by_name.items():
            self.add_points(trial, name, steps, values)
        if points and rate is not None:
            self.add_points(trial, RATE, [points[-1][1]], [rate])

    def best_trial(self) -> int | None:
        """The trial with the lowest best loss (the lower id on a tie), or None."""
        scored = [(r["best"], t) for t, r in self._rows.items() if r["best"] is not None]
        return min(scored)[1] if scored else None

    def curve(self, key: str, trial: int) -> tuple[list[float], list[float]]:
        """The kept points of ``trial``'s curve of ``key`` (``"loss"``, ``RATE``, a metric)."""
        c = self._curves.get(key, {}).get(trial)
        return (c.x, c.y) if c is not None else ([], [])

    # -- display ------------------------------------------------------------------------------
    def show(self) -> None:
        """Put the widget under the running cell; when no front end draws it
        (``board.widget.live``), a line of text (the picture, at the end)."""
        from IPython.display import display

        from ..board.widget import SweepWidget, live

        global _last
        _last = self
        self.live = live()
        if self.live:
            self.widget = SweepWidget()
            self.widget.head = self._head()
            self._refresh_history()
        self._handle = display(self._bundle(), raw=True, display_id=True)

    @property
    def seen(self) -> bool:
        """Whether a front end acknowledged this board's widget (read between cells)."""
        return bool(getattr(self.widget, "seen", False))

    def _bundle(self, png: bytes | None = None) -> dict:
        from ..board.widget import bundle

        return bundle(self.widget, f"nbdist sweep: {self.title}", png)

    # -- updating -----------------------------------------------------------------------------
    def update(self, force: bool = False) -> None:
        """Send the browser what changed (nothing, if nothing did); at most about four times a
        second unless ``force``."""
        now = self.clock()
        if not force and now - self._last_send < _SEND_EVERY:
            return
        self._last_send = now
        if self.widget is None:
            return
        head = self._head()
        if head != self.widget.head:
            self.widget.head = head
        if (force and self.status != "running") or now - self._last_history >= _HISTORY_EVERY:
            self._refresh_history()
            return
        delta = self._delta()
        if delta:
            self.seq += 1
            delta.update(kind="delta", seq=self.seq)
            self.widget.send(delta)
            self.messages += 1
            self.sent_bytes += _size(delta)

    def _head(self) -> dict:
        counts = {s: 0 for s in STATES}
        for row in self._rows.values():
            counts[row["state"]] += 1
        return {
            "title": self.title,
            "status": self.status,
            "counts": counts,
            "trials": len(self._rows),
            "best": self.best_trial(),
            # whole seconds: sent once a second
            "elapsed": round((self._ended or self.clock()) - self._started),
        }

    def _delta(self) -> dict:
        out: dict[str, Any] = {}
        metrics = {}
        for key, boxes in self._out.items():
            pts = {str(t): list(p) for t, box in boxes.items() if (p := box.take())}
            if pts:
                metrics[key] = pts
        if metrics:
            out["metrics"] = metrics
        rows = [row for t, row in self._rows.items() if self._rows_sent.get(t) != row]
        if rows:
            out["rows"] = rows
            self._rows_sent.update({row["trial"]: row for row in rows})
        return out

    def _refresh_history(self) -> None:
        """Everything so far, decimated: where a view that appears now starts."""
        self._last_history = self.clock()
        for boxes in self._out.values():
            for box in boxes.values():
                box.take()  # in the history now
        self._rows_sent = dict(self._rows)
        self.seq += 1
        history: dict[str, Any] = {"kind": "history", "seq": self.seq, "rows": self.rows}
        history["metrics"] = {
            key: {
                str(t): decimated(c, max(50, _HISTORY_POINTS // max(1, len(curves))))
                for t, c in sorted(curves.items())
            }
            for key, curves in self._curves.items()
        }
        self.widget.history = history
        self.messages += 1
        self.sent_bytes += _size(history)

    # -- the end ------------------------------------------------------------------------------
    def finish(self, status: str) -> None:
        """The last update (``status``: ok, interrupted or failed); the output keeps the live
        widget and gains a static picture of the board."""
        self.status = str(status)
        self._ended = self.clock()
        self.update(force=True)
        png = self.picture()
        if self._handle is not None:
            self._handle.update(self._bundle(png), raw=True)

    def picture(self) -> bytes:
        """The board as one PNG (``picture``: matplotlib, off-screen)."""
        title = f"{self.title} · {self.status}"
        curves = self._curves
        return picture.png(
            title, self._head(), self.rows, curves["loss"], curves[RATE], self.best_trial()
        )


def _size(msg: dict) -> int:
    return len(json.dumps(msg, separators=(",", ":")))
