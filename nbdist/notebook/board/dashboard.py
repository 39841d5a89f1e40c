"""The live dashboard under a ``%%distributed`` cell: the kernel's half.

The browser draws it (``widget.DashboardWidget``, an anywidget whose ES module is built from
``extension/src/boards/``); the kernel keeps the state and sends what is new, a few times a
second, as one small message: points appended to each metric's curves (per rank and the mean),
worker rows that changed, new events, log tails that moved (``_delta``). A view that appears
later (a second view, a notebook reopened while the kernel lives) starts from ``history``, a
decimated copy of everything, refreshed every few seconds and at the end; every message carries
a sequence number, so the browser never applies the same points twice. No matplotlib runs
at all.

When the cell ends the output keeps the widget and gains one static SVG picture of it
(``picture``: written as text, in milliseconds), which renderers without widgets (GitHub,
nbconvert, a notebook reopened without a kernel) show. When no front end draws the board
(``widget.live``: papermill, ``jupyter nbconvert --execute``) there is no widget at all: the
output is a line of text until the cell ends, then the picture, and an update costs the kernel
one samples/s figure (kept for the picture) instead of a message to nobody.

After a recovery the board tells one story: the time spent recovering is a span of its own
(``recovering``), a band on the samples/s chart with no line drawn across it; a rank's fresh
engine is the same row, running again, and the events that tell the failure and the recovery
stay in view whatever follows (``shown``).

Everything here is plain data: numbers are finite or None (a NaN loss travels as the text
"nan"), and text from engines is sent as text; the browser sets it with ``textContent``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ...config import TelemetryConfig
from ...telemetry.curves import Curve, Outbox, decimated
from ...telemetry.events import RunEvent
from ...telemetry.format import fmt, fmt_duration
from ...telemetry.spread import MANY_RANKS, Spread
from . import picture
from .collector import Collector
from .shown import curves_of, event_dict, in_view, number, rank_row, said

_HISTORY_EVERY = 5.0  # seconds between refreshes of the late views' starting point
_EVENTS_KEPT = 500  # ordinary events in a history (beside those of the run's recoveries)
_EVENTS_PICTURED = 5
# Past MANY_RANKS (the one figure, telemetry.spread's: the sidebar's too) a board draws each
# metric's mean, the band of the ranks' values about it and its outlier ranks, not a line per
# rank; and sends a rank's row at once only when its state changes (every row comes with the
# history, every few seconds): what the browser is sent grows with what it can draw, not with
# the ranks' records.
#: Count the bytes sent to the browser (``Dashboard.sent_bytes``): a benchmark's question, which
#: costs a JSON encoding of every message again, so off unless asked.
COUNT_BYTES = False


class Dashboard:
    """The state of one run's dashboard, and what of it the browser has not seen yet.

    ``show()`` puts the widget under the cell; ``update()`` (at the cell's ``--refresh``) sends what
    changed; ``finish()`` sends the rest, refreshes the history and adds the static picture.
    ``log_ranks``: the ranks whose output is not shown under the cell, so the board shows their
    last lines (rank 0's, printed below the board already, are not repeated).
    """

    def __init__(
        self,
        title: str,
        cfg: TelemetryConfig | None = None,
        log_ranks: frozenset[int] | None = None,
        means: Mapping[str, tuple[float, float]] | None = None,
        spread: Spread | None = None,
    ):
        self.cfg = cfg or TelemetryConfig()
        # each metric's latest settled mean over ranks, (step, value), as the run's observers
        # are told it (the run store keeps the same): the head's loss and its step
        self.means = means if means is not None else {}
        self.spread = spread  # many ranks: the bands and outliers drawn instead of every rank
        self._outliers: dict[str, list[int]] = {}  # the outlier ranks the browser has
        self.title = title
        self.log_ranks = log_ranks
        self.widget = None
        self._handle = None
        self.seq = 0
        self.updates = 0
        self.live: bool | None = None  # a widget updated while the cell runs (set by show)
        self.messages = 0  # messages sent to the browser: deltas and histories
        self.seconds = 0.0  # kernel time spent making them (and the head, the rows)
        self.sent_bytes = 0  # what the kernel sent the browser, when COUNT_BYTES (benchmarks)
        self.rate = Curve(2000)  # (seconds since start, samples/s), from the first figure on
        self._rate_out = Outbox()
        # the spans spent recovering, [from, to] in seconds since the start (to: None while on)
        self.recovering: list[list] = []
        self._recovering_sent: list[list] = []
        self._rows: dict[int, dict] = {}
        self._rows_sent: dict[int, dict] = {}
        self._events_sent = 0
        self._logs_sent: dict[int, tuple] = {}
        self._last_history = 0.0
        self._records_seen = 0
        self.rows: list[dict] = []  # the latest table, as data
        self.head: dict = {}  # the latest progress line, as data
        self.profile: dict | None = None  # where a step's time went, once the cell has ended
        self._latest: tuple | None = None  # the latest update's (col, events, status, now)

    # -- display ------------------------------------------------------------------------------
    def show(self, col: Collector) -> None:
        """Put the widget under the running cell, starting from what ``col`` already holds;
        when no front end draws it (``widget.live``), a line of text (the picture, at the end)."""
        from IPython.display import display

        from .widget import DashboardWidget, live

        self.live = live()
        if self.live:
            self.widget = DashboardWidget()
            self.widget.resend = self._resend
            col.series.keep_fresh()  # from now on, what is new goes out with each update
            self._refresh_history(col, [], "running", col.clock())
        self._handle = display(self._bundle(), raw=True, display_id=True)

    @property
    def seen(self) -> bool:
        """Whether a front end acknowledged this board's widget (read between cells)."""
        return bool(getattr(self.widget, "seen", False))

    def _bundle(self, svg: str | None = None) -> dict:
        from .widget import bundle

        return bundle(self.widget, f"nbdist dashboard: {self.title}", svg=svg)

    # -- updating -----------------------------------------------------------------------------
    def update(
        self,
        col: Collector,
        events: list[RunEvent],
        status: str,
        final: bool = False,
        now: float | None = None,
    ) -> None:
        """Send the browser what changed since the last update (nothing, if nothing did);
        ``now``: the time the head's elapsed time is taken at (the run's end, at the end)."""
        now = col.clock() if now is None else now
        self._latest = (col, events, status, now)
        self.updates += 1
        at = round(now - col.started, 3)
        was = bool(self.recovering) and self.recovering[-1][1] is None
        recovering = self._note_recovery(status, at)
        # none while no attempt runs, nor at the instant the span closes (a point on its edge)
        rate = None if recovering or was else col.samples_per_s()
        if rate is not None and col.records != self._records_seen:  # a new figure, not a repeat
            self._records_seen = col.records
            self.rate.add(at, rate)
            self._rate_out.add(at, rate)
        if self.widget is None and not final:
            return  # nobody draws it: the picture at the end needs the rows of then alone
        t0 = time.perf_counter()
        zero_based = col.first_step == 0
        self.rows = [rank_row(st, now, zero_based) for _, st in sorted(col.ranks.items())]
        self._rows = {row["rank"]: row for row in self.rows}
        self.head = self._head(col, status, now, rate)
        if self.widget is None:
            return
        self.widget.head = self.head
        if final or now - self._last_history >= _HISTORY_EVERY or self._outliers_moved(col):
            self._refresh_history(col, events, status, now)
        else:
            delta = self._delta(col, events)
            if delta:
                self.seq += 1
                delta.update(kind="delta", seq=self.seq)
                self.widget.send(delta)
                self.messages += 1
                self.sent_bytes += _size(delta) if COUNT_BYTES else 0
        self.seconds += time.perf_counter() - t0

    def _note_recovery(self, status: str, at: float) -> bool:
        """Open a span spent recovering as the run enters recovery, close it as it leaves
        (running again, or ended); whether it is recovering."""
        spans = self.recovering
        going = bool(spans) and spans[-1][1] is None
        recovering = status == "recovering"
        if recovering and not going:  # told at the moment recovery began: after the last figure
            spans.append([max([at, *self.rate.x[-1:]]), None])
        elif going and not recovering:
            spans[-1][1] = max(at, spans[-1][0])
        return recovering

    def _head(self, col: Collector, status: str, now: float, rate: float | None) -> dict:
        return {
            "title": self.title,
            "status": status,
            "steps": col.done(),
            "total": col.total,
            "eta": number(col.eta()) if status == "running" else None,
            "rate": number(rate),
            **_mean_of(self.means, col),
            "elapsed": round(now - col.started, 1),
            "ranks": len(col.ranks),
            "dropped": col.series.dropped,  # metrics past the charted limit
        }

    def _logs(self, col: Collector) -> dict[int, tuple]:
        """The last lines of the ranks whose output the cell does not show."""
        return {
            r: tuple(st.log)
            for r, st in col.ranks.items()
            if st.log and (self.log_ranks is None or r in self.log_ranks)
        }

    def _spread(self, col: Collector) -> Spread | None:
        """The bands and outliers, when the board draws them (many ranks) instead of every rank."""
        return self.spread if len(col.ranks) > MANY_RANKS else None

    def _outliers_moved(self, col: Collector) -> bool:
        """Whether some metric's outlier ranks changed (the next message is then a history:
        a new outlier's line is drawn whole)."""
        spread = self._spread(col)
        if spread is None:
            return False
        now = {name: spread.outliers(name) for name in col.series.names}
        return now != self._outliers

    def _delta(self, col: Collector, events: list[RunEvent]) -> dict:
        out: dict[str, Any] = {}
        metrics: dict[str, dict] = {}
        spread = self._spread(col)
        for name, by_rank in col.series.take_fresh().items():
            entry = metrics[name] = {}
            mean = by_rank.pop(None, None)
            if spread is not None:  # the outliers' points alone, and the band's
                shown = self._outliers.get(name, ())
                by_rank = {r: pts for r, pts in by_rank.items() if r in shown}
                entry.update({side: list(p) for side, p in spread.take_fresh(name).items()})
            if by_rank:
                entry["ranks"] = {str(r): list(pts) for r, pts in by_rank.items()}
            if mean is not None:
                entry["mean"] = list(mean)
        if metrics:
            out["metrics"] = metrics
        pts = self._rate_out.take()
        if pts:
            out["rate"] = list(pts)
        rows = [row for r, row in self._rows.items() if self._rows_sent.get(r) != row]
        if spread is not None:  # many ranks: a change of state now, the rest with the history
            rows = [
                r for r in rows if r["state"] != self._rows_sent.get(r["rank"], {}).get("state")
            ]
        if rows:
            out["rows"] = rows
            self._rows_sent.update({row["rank"]: row for row in rows})
        if len(events) > self._events_sent:
            out["events"] = [event_dict(e) for e in events[self._events_sent :]]
            self._events_sent = len(events)
        if self.recovering != self._recovering_sent:
            out["recovering"] = self._recovering_sent = [list(s) for s in self.recovering]
        moved = {r: tail for r, tail in self._logs(col).items() if self._logs_sent.get(r) != tail}
        if moved:
            out["logs"] = {str(r): list(tail) for r, tail in moved.items()}
            self._logs_sent.update(moved)
        return out

    def _resend(self) -> None:
        """A front end asked for the whole board again (it lost a message, or heard nothing for
        a while): the head and everything so far, as of the latest update."""
        if self._latest is not None and self.widget is not None:
            self._refresh_history(*self._latest)
            self.widget.send_state(["head", "picture"])

    def _refresh_history(self, col: Collector, events: list[RunEvent], status: str, now: float):
        """Everything so far, decimated: where a view that appears now starts."""
        self._last_history = now
        col.series.take_fresh()  # in the history now
        self._rate_out.take()
        self._rows_sent = dict(self._rows)
        self._events_sent = len(events)
        self._recovering_sent = [list(s) for s in self.recovering]
        self._logs_sent = self._logs(col)
        series = col.series
        spread = self._spread(col)
        if spread is not None:
            for name in series.names:
                spread.take_fresh(name)  # in the history now
            self._outliers = {name: spread.outliers(name) for name in series.names}
        self.seq += 1
        history = {
            "kind": "history",
            "seq": self.seq,
            "metrics": {
                name: curves_of(series, name, spread, self._outliers.get(name))
                for name in series.names
            },
            "rate": decimated(self.rate, 1000),
            "rows": self.rows,
            "events": [event_dict(e) for e in in_view(events, _EVENTS_KEPT)],
            "recovering": self._recovering_sent,
            "logs": {str(r): list(tail) for r, tail in self._logs_sent.items()},
            "profile": self.profile,
        }
        if self.widget is not None:
            self.widget.history = history
            self.messages += 1
            self.sent_bytes += _size(history) if COUNT_BYTES else 0

    # -- the end ------------------------------------------------------------------------------
    def finish(
        self,
        col: Collector,
        events: list[RunEvent],
        status: str,
        ended: float,
        profile: dict | None = None,
    ) -> str:
        """Final update, its elapsed time taken at ``ended`` (the run's end, as the run store
        has it), with the cell's profile when it had one (``debug.profile.Profile.shown``:
        drawn as a bar per rank); the output keeps the live widget and gains a static picture
        (an SVG: ``picture``), which is returned."""
        self.profile = profile
        self.update(col, events, status, final=True, now=ended)
        series = col.series
        bands = _bands_of(self._spread(col), self._outliers, len(col.ranks))
        svg = picture.dashboard_svg(
            title=f"{self.title} · {status}",
            summary=_summary_line(self.head),
            metrics={
                name: (
                    [
                        (r, c.x, c.y)
                        for r, c in sorted(series.ranks[name].items())
                        if name not in bands or r in bands[name].outliers
                    ],
                    (series.mean[name].x, series.mean[name].y),
                )
                for name in series.names
            },
            bands=bands,
            rate=(self.rate.x, self.rate.y),
            rows=self.rows,
            events=[(e.kind, e.rank, said(e)) for e in in_view(events, _EVENTS_PICTURED)],
            recovering=[(a, b) for a, b in self.recovering if b is not None],
        )
        if self.widget is not None:
            self.widget.picture = svg  # shown by a view that could not draw
        if self._handle is not None:
            self._handle.update(self._bundle(svg), raw=True)
        return svg


def _bands_of(spread: Spread | None, outliers: dict[str, list[int]], ranks: int) -> dict:
    """Past a few ranks, each metric's band and outlier ranks for the picture, as the live
    board draws them (the outliers the browser was last sent)."""
    if spread is None:
        return {}
    return {
        name: picture.Band(
            (lo.x, lo.y),
            (spread.hi[name].x, spread.hi[name].y),
            ranks,
            tuple(outliers.get(name, ())),
        )
        for name, lo in spread.lo.items()
        if name in spread.hi
    }


def _mean_of(means: Mapping[str, tuple[float, float]], col: Collector) -> dict:
    """The head's loss: the mean over ranks at the latest step every rank passed, and that step
    (as the observers were told it; the collector's latest mean before any was told)."""
    got = means.get("loss")
    if got is None:
        curve = col.series.mean.get("loss")
        got = (curve.last_x(), curve.last()) if curve is not None else (None, None)
    step, value = got
    return {"mean_loss": number(value), "mean_step": number(step)}


def _size(msg: dict) -> int:
    import json

    return len(json.dumps(msg, separators=(",", ":")))


def _summary_line(head: dict) -> str:
    parts = []
    if head.get("steps") is not None:
        total = head.get("total")
        parts.append(f"{head['steps']:,}" + (f" / {total:,}" if total else "") + " steps")
    if head.get("rate") is not None:
        parts.append(f"{head['rate']:,.0f} samples/s")
    if head.get("mean_loss") is not None:
        parts.append(f"loss {fmt(head['mean_loss'])}")
    parts.append(fmt_duration(head.get("elapsed", 0)))
    return " · ".join(parts)
