"""The live dashboard under a ``%%distributed`` cell: the kernel's half.

The browser draws it (``widget.DashboardWidget``, an anywidget whose ES module is
``static/dashboard.js``); the kernel keeps the state and sends what is new, a few times a
second, as one small message: points appended to each curve, worker rows that changed, new
events, log tails that moved (``_delta``). A view that appears later (a second view, a notebook
reopened while the kernel lives) starts from ``history``, a decimated copy of everything,
refreshed every few seconds and at the end; every message carries a sequence number, so the
browser never applies the same points twice. No matplotlib runs while the cell runs.

When the cell ends the output keeps the widget and gains one static PNG of it (``charts``), which
renderers without widgets (GitHub, nbconvert, a notebook reopened without a kernel) show.

Everything here is plain data: numbers are finite or None (a NaN loss travels as the text
"nan"), and text from engines is sent as text; the browser sets it with ``textContent``.
"""

from __future__ import annotations

import math
from typing import Any

from ...config import TelemetryConfig
from ...telemetry.events import MetricRecord, RunEvent
from .collector import Collector, RankState
from .curves import Curve, Outbox, decimated

_HISTORY_EVERY = 5.0  # seconds between refreshes of the late views' starting point
_HISTORY_POINTS = 4000  # points per history, shared among the ranks' curves
_EVENTS_KEPT = 50


def _num(x: Any) -> float | int | None:
    """A number JSON can carry: finite, or None."""
    if x is None or isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def rank_row(st: RankState, now: float) -> dict:
    """One worker-table row, as plain data (the browser and the final picture share it)."""
    h = st.health  # a HealthSample, or None before the first
    loss: Any = st.nonfinite if st.nonfinite is not None else _num(st.loss)
    return {
        "rank": st.rank,
        "host": st.host or "",
        "state": st.state,
        "step": st.step,
        "loss": loss,
        "step_ms": _num(st.step_time and st.step_time * 1000),
        "cpu": _num(h and h.cpu),
        "rss_mb": _num(h and h.rss and h.rss / 2**20),
        "gpu_util": _num(h and h.gpu_util),
        "gpu_mb": _num(h and h.gpu_mem and h.gpu_mem / 2**20),
        "comm": _num(h and h.comm_share is not None and h.comm_share * 100),
        "stage": str(h.pipeline) if h and h.pipeline else None,  # a pipeline's: "0/2", "1/2 r1"
        "idle": _num(h and h.idle_share is not None and h.idle_share * 100),
        # whole seconds: a row is sent again when something a person would notice changed
        "quiet": None if st.last_seen is None else round(max(0.0, now - st.last_seen)),
    }


def event_dict(e: RunEvent) -> dict:
    return {"time": e.time, "kind": str(e.kind), "rank": e.rank, "message": str(e.message or "")}


class Dashboard:
    """The state of one run's dashboard, and what of it the browser has not seen yet.

    ``show()`` puts the widget under the cell; ``update()`` (every ``ui_interval``) sends what
    changed; ``finish()`` sends the rest, refreshes the history and adds the static picture.
    """

    def __init__(self, title: str, cfg: TelemetryConfig | None = None):
        self.cfg = cfg or TelemetryConfig()
        self.title = title
        self.widget = None
        self._handle = None
        self.seq = 0
        self.updates = 0
        self.sent_bytes = 0  # what the kernel sent the browser (the benchmark reads it)
        self.rate = Curve(2000)  # (seconds since start, samples/s), from the first figure on
        self._loss_out: dict[int, Outbox] = {}
        self._mean_out = Outbox()
        self._rate_out = Outbox()
        self._rows: dict[int, dict] = {}
        self._rows_sent: dict[int, dict] = {}
        self._events_sent = 0
        self._logs_sent: dict[int, tuple] = {}
        self._last_history = 0.0
        self._records_seen = 0
        self.rows: list[dict] = []  # the latest table, as data

    # -- feeding: called by the monitor as records arrive -------------------------------------
    def add_records(self, rank: int, recs: list[MetricRecord]) -> None:
        """New metric records of ``rank``: their finite losses go out with the next update."""
        out = self._loss_out.get(rank)
        if out is None:
            out = self._loss_out[rank] = Outbox()
        for rec in recs:
            if rec.step is not None and _num(rec.loss) is not None:
                out.add(rec.step, rec.loss)

    def add_mean(self, step: int, value: float) -> None:
        """A newly settled point of the mean loss."""
        self._mean_out.add(step, value)

    # -- display ------------------------------------------------------------------------------
    def show(self, col: Collector) -> None:
        """Put the widget under the running cell, starting from what ``col`` already holds."""
        from IPython.display import display

        from .widget import DashboardWidget

        self.widget = DashboardWidget()
        self._refresh_history(col, [], "running", col.clock())
        self._handle = display(self._bundle(), raw=True, display_id=True)

    def _bundle(self, png: bytes | None = None) -> dict:
        from .widget import bundle

        return bundle(self.widget, f"nbdist dashboard: {self.title}", png)

    # -- updating -----------------------------------------------------------------------------
    def update(
        self, col: Collector, events: list[RunEvent], status: str, final: bool = False
    ) -> None:
        """Send the browser what changed since the last update (nothing, if nothing did)."""
        now = col.clock()
        self.updates += 1
        rate = col.samples_per_s()
        if rate is not None and col.records != self._records_seen:  # a new figure, not a repeat
            self._records_seen = col.records
            self.rate.add(round(now - col.started, 3), rate)
            self._rate_out.add(round(now - col.started, 3), rate)
        self.rows = [rank_row(st, now) for _, st in sorted(col.ranks.items())]
        self._rows = {row["rank"]: row for row in self.rows}
        if self.widget is None:
            return
        self.widget.head = self._head(col, status, now, rate)
        if final or now - self._last_history >= _HISTORY_EVERY:
            self._refresh_history(col, events, status, now)
            return
        delta = self._delta(col, events)
        if delta:
            self.seq += 1
            delta.update(kind="delta", seq=self.seq)
            self.widget.send(delta)
            self.sent_bytes += _size(delta)

    def _head(self, col: Collector, status: str, now: float, rate: float | None) -> dict:
        done, total = col.done(), col.total
        return {
            "title": self.title,
            "status": status,
            "step": done,
            "done": done,
            "total": total,
            "eta": _num(col.eta()) if status == "running" else None,
            "rate": _num(rate),
            "mean_loss": _num(col.mean_loss()),
            "elapsed": round(now - col.started, 1),
            "ranks": len(col.ranks),
        }

    def _delta(self, col: Collector, events: list[RunEvent]) -> dict:
        out: dict[str, Any] = {}
        loss = {r: pts for r, box in self._loss_out.items() if (pts := box.take())}
        if loss:
            out["loss"] = {str(r): [xs, ys] for r, (xs, ys) in loss.items()}
        for key, box in (("mean", self._mean_out), ("rate", self._rate_out)):
            pts = box.take()
            if pts:
                out[key] = list(pts)
        rows = [row for r, row in self._rows.items() if self._rows_sent.get(r) != row]
        if rows:
            out["rows"] = rows
            self._rows_sent.update({row["rank"]: row for row in rows})
        if len(events) > self._events_sent:
            out["events"] = [event_dict(e) for e in events[self._events_sent :]]
            self._events_sent = len(events)
        logs = {}
        for r, st in col.ranks.items():
            tail = tuple(st.log)
            if tail and self._logs_sent.get(r) != tail:
                logs[str(r)] = list(tail)
                self._logs_sent[r] = tail
        if logs:
            out["logs"] = logs
        return out

    def _refresh_history(self, col: Collector, events: list[RunEvent], status: str, now: float):
        """Everything so far, decimated: where a view that appears now starts."""
        self._last_history = now
        for box in (*self._loss_out.values(), self._mean_out, self._rate_out):
            box.take()  # in the history now
        self._rows_sent = dict(self._rows)
        self._events_sent = len(events)
        self._logs_sent = {r: tuple(st.log) for r, st in col.ranks.items()}
        per_rank = max(50, _HISTORY_POINTS // max(1, len(col.ranks)))
        self.seq += 1
        history = {
            "kind": "history",
            "seq": self.seq,
            "loss": {str(r): decimated(st.losses, per_rank) for r, st in sorted(col.ranks.items())},
            "mean": decimated(col.mean, 2000),
            "rate": decimated(self.rate, 1000),
            "rows": self.rows,
            "events": [event_dict(e) for e in events[-_EVENTS_KEPT:]],
            "logs": {str(r): list(st.log) for r, st in col.ranks.items()},
        }
        if self.widget is not None:
            self.widget.history = history
            self.sent_bytes += _size(history)

    # -- the end ------------------------------------------------------------------------------
    def finish(self, col: Collector, events: list[RunEvent], status: str) -> bytes:
        """Final update; the output keeps the live widget and gains a static picture of it."""
        from . import charts

        self.update(col, events, status, final=True)
        png = charts.dashboard_picture(
            title=f"{self.title} · {status}",
            summary=_summary_line(self.widget.head if self.widget else {}),
            ranks=[(r, st.losses.x, st.losses.y) for r, st in sorted(col.ranks.items())],
            mean=(col.mean.x, col.mean.y),
            rate=(self.rate.x, self.rate.y),
            rows=self.rows,
            events=[(e.kind, e.rank, e.message) for e in events[-5:]],
        )
        if self._handle is not None:
            self._handle.update(self._bundle(png), raw=True)
        return png


def _size(msg: dict) -> int:
    import json

    return len(json.dumps(msg, separators=(",", ":")))


def _summary_line(head: dict) -> str:
    parts = []
    if head.get("step") is not None:
        total = head.get("total")
        parts.append(f"step {head['step']}" + (f" / {total}" if total else ""))
    if head.get("rate") is not None:
        parts.append(f"{head['rate']:,.0f} samples/s")
    if head.get("mean_loss") is not None:
        parts.append(f"mean loss {head['mean_loss']:.4g}")
    parts.append(f"{head.get('elapsed', 0):.0f} s")
    return " · ".join(parts)
