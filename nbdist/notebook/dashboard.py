"""The live dashboard under a ``%%distributed`` cell: progress, loss, throughput, workers, logs.

An ipywidgets box whose numbers change every ``ui_interval`` and whose charts (matplotlib, drawn
off-screen with Agg into a PNG) are redrawn every ``chart_interval``. When the cell ends the widget
keeps its final state, and its output also carries a PNG picture of it, which renderers without
widgets (GitHub, nbconvert, a notebook reopened without a kernel) show instead.

Text from engines (host names, log lines, messages) is shown as text: it goes through
``html.escape`` into HTML widgets, or into a Textarea.
"""

from __future__ import annotations

import base64
import html
import time
from concurrent.futures import Future, ThreadPoolExecutor

import ipywidgets as w

from ..config import TelemetryConfig
from ..telemetry import events as ev
from ..telemetry.events import RunEvent
from .charts import figure_png, plot, render_chart, warm_up
from .collector import Collector, RankState

COLOURS = {ev.OK: "#2e7d32", ev.SLOW: "#ef6c00", ev.SILENT: "#9e9d24", ev.DEAD: "#c62828"}
_EVENT_COLOURS = {
    "nan": "#c62828",
    "died": "#c62828",
    "dead": "#c62828",
    "failed": "#c62828",
    "slow": "#ef6c00",
    "silent": "#9e9d24",
    "restart": "#1565c0",
    "checkpoint": "#1565c0",
    "recovered": "#2e7d32",
    "warning": "#ef6c00",
}
_COLUMNS = (
    "rank",
    "host",
    "state",
    "step",
    "loss",
    "step ms",
    "cpu %",
    "rss MB",
    "gpu",
    "comm %",
    "quiet s",
)
_TABLE_ROWS_PNG = 16


def _fmt_secs(s: float | None) -> str:
    if s is None:
        return "?"
    s = int(round(s))
    if s >= 3600:
        return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
    return f"{s // 60}:{s % 60:02d}"


def _fmt(x, spec: str = ".4g", none: str = "-") -> str:
    return none if x is None else format(x, spec)


def rank_row(st: RankState, now: float) -> dict:
    """One worker-table row, as plain data (the widget and the picture share it)."""
    h = st.health  # a HealthSample, or None before the first
    quiet = None
    if st.last_seen is not None:
        quiet = now - st.last_seen
    gpu = None
    if h is not None and (h.gpu_util is not None or h.gpu_mem is not None):
        mem = (h.gpu_mem or 0) / 2**20
        gpu = f"{_fmt(h.gpu_util, '.0f', '?')}% {mem:.0f}MB"
    return {
        "rank": st.rank,
        "host": st.host,
        "state": st.state,
        "step": st.step,
        "loss": st.loss if st.nonfinite is None else float(st.nonfinite),
        "step_time": st.step_time,
        "cpu": h and h.cpu,
        "rss": h and h.rss,
        "gpu": gpu,
        "comm_share": h and h.comm_share,
        "quiet": quiet,
    }


def _cells(row: dict) -> list[str]:
    return [
        str(row["rank"]),
        row["host"] or "?",
        row["state"],
        _fmt(row["step"], "d"),
        _fmt(row["loss"]),
        _fmt(row["step_time"] and row["step_time"] * 1000, ".0f"),
        _fmt(row["cpu"], ".0f"),
        _fmt(row["rss"] and row["rss"] / 2**20, ".0f"),
        row["gpu"] or "-",
        _fmt(row["comm_share"] and row["comm_share"] * 100, ".0f"),
        _fmt(row["quiet"], ".1f"),
    ]


class Dashboard:
    """The widget of one run. ``update()`` redraws it from a Collector; ``finish()`` freezes it."""

    def __init__(self, title: str, cfg: TelemetryConfig | None = None):
        self.cfg = cfg or TelemetryConfig()
        self.title = title
        self.header = w.HTML()
        self.progress = w.IntProgress(
            value=0, min=0, max=1, bar_style="info", layout=w.Layout(width="40%")
        )
        self.status = w.Label()
        self.alert = w.HTML()
        # hidden until the first chart is drawn (an empty Image shows as a broken picture)
        self.chart = w.Image(format="png", layout=w.Layout(max_width="100%", display="none"))
        self.table = w.HTML()
        self.logs = w.Textarea(disabled=True, layout=w.Layout(width="100%", height="8em"))
        self.events_box = w.HTML()
        self.widget = w.VBox(
            [
                self.header,
                w.HBox([self.progress, self.status]),
                self.alert,
                self.chart,
                self.table,
                w.Label("last lines of each rank's output"),
                self.logs,
                self.events_box,
            ]
        )
        self.rows: list[dict] = []  # the table, as data
        self.throughput: tuple[list, list] = ([], [])  # (seconds since start, samples/s)
        self.updates = 0
        self.redraws = 0
        self._handle = None
        self._last_chart = 0.0
        self._drawn_records = -1
        # Charts are drawn off the kernel's main thread (100+ ms each), then shown by update().
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="nbdist-chart")
        self._pending: Future | None = self._pool.submit(warm_up)

    # -- display ----------------------------------------------------------------------------
    def show(self) -> None:
        """Put the widget under the running cell."""
        from IPython.display import display

        self._handle = display(self._bundle(), raw=True, display_id=True)

    def _bundle(self, png: bytes | None = None) -> dict:
        data = dict(self.widget._repr_mimebundle_() or {})
        data["text/plain"] = f"nbdist dashboard: {self.title}"
        if png is not None:
            data["image/png"] = base64.b64encode(png).decode("ascii")
        return data

    # -- drawing ----------------------------------------------------------------------------
    def update(
        self, col: Collector, events: list[RunEvent], status: str, final: bool = False
    ) -> None:
        """Show the collector's state: numbers every call, charts and tables when due.
        ``status``: the run's (running, recovering, or how it ended)."""
        now = col.clock()
        self.updates += 1
        done, total = col.done(), col.total
        elapsed = now - col.started
        self.header.value = (
            f"<b>{html.escape(self.title)}</b> &middot; {html.escape(status)} &middot; "
            f"{len(col.ranks)} ranks &middot; {_fmt_secs(elapsed)} elapsed"
        )
        if total:
            self.progress.max = total
            self.progress.value = min(done or 0, total)
        elif done:
            self.progress.max = max(self.progress.max, done)
            self.progress.value = done
        self.progress.bar_style = {"ok": "success", "running": "info", "recovering": "warning"}.get(
            status, "danger"
        )
        rate = col.samples_per_s()
        parts = [f"step {done if done is not None else '-'}" + (f" / {total}" if total else "")]
        if total and done is not None:
            parts.append(f"{100 * min(done, total) / total:.0f}%")
            if status == "running":
                parts.append(f"ETA {_fmt_secs(col.eta())}")
        if rate is not None:
            parts.append(f"{rate:,.0f} samples/s")
        mean = col.mean_loss()
        if mean is not None:
            parts.append(f"mean loss {mean:.4g}")
        self.status.value = " · ".join(parts)
        bad = [st for st in col.ranks.values() if st.nonfinite]
        self.alert.value = "".join(
            f'<div style="color:white;background:#c62828;padding:2px 6px">loss is '
            f"{html.escape(st.nonfinite)} on rank {st.rank}</div>"
            for st in bad
        )
        self._take_chart()
        if final or now - self._last_chart >= self.cfg.chart_interval:
            self._last_chart = now
            if rate is not None or not self.throughput[0]:
                self.throughput[0].append(elapsed)
                self.throughput[1].append(rate or 0.0)
            self._slow_parts(col, events, now, final)

    def _slow_parts(self, col: Collector, events: list[RunEvent], now: float, final: bool) -> None:
        self.rows = [rank_row(st, now) for st in sorted(col.ranks.values(), key=lambda s: s.rank)]
        self.table.value = self._table_html()
        self.logs.value = "\n".join(
            f"[rank {st.rank}] {line}"
            for st in sorted(col.ranks.values(), key=lambda s: s.rank)
            for line in st.log
        )
        self.events_box.value = "".join(
            f'<div><span style="color:{_EVENT_COLOURS.get(e.kind, "#555")}">'
            f"{time.strftime('%H:%M:%S', time.localtime(e.time))} "
            f"{html.escape(str(e.kind))}</span>"
            f"{html.escape(' rank ' + str(e.rank) if e.rank is not None else '')}: "
            f"{html.escape(str(e.message or ''))}</div>"
            for e in events[-12:]
        )
        self._take_chart(wait=final)
        if col.records != self._drawn_records or final:
            data = self._chart_data(col)
            self._drawn_records = col.records
            if final:
                self._set_chart(render_chart(data))
            elif self._pending is None:
                self._pending = self._pool.submit(render_chart, data)

    def _take_chart(self, wait: bool = False) -> None:
        """Show the chart drawn in the background, if it is ready."""
        f = self._pending
        if f is not None and (wait or f.done()):
            self._pending = None
            png = f.result()
            if png:
                self._set_chart(png)

    def _set_chart(self, png: bytes) -> None:
        self.chart.value = png
        self.chart.layout.display = None
        self.redraws += 1

    def _chart_data(self, col: Collector) -> dict:
        """A copy of what the charts show, for the drawing thread."""
        mean = col.mean_series()
        return {
            "ranks": [
                (st.rank, list(st.losses.steps), list(st.losses.values))
                for st in sorted(col.ranks.values(), key=lambda s: s.rank)
            ],
            "mean": (list(mean.steps), list(mean.values)),
            "rate": (list(self.throughput[0]), list(self.throughput[1])),
        }

    def _table_html(self) -> str:
        head = "".join(f"<th style='padding:0 6px'>{c}</th>" for c in _COLUMNS)
        body = []
        for row in self.rows:
            tds = []
            for i, cell in enumerate(_cells(row)):
                style = "padding:0 6px"
                if i == 2:
                    style += f";color:white;background:{COLOURS.get(row['state'], '#555')}"
                tds.append(f"<td style='{style}'>{html.escape(cell)}</td>")
            body.append("<tr>" + "".join(tds) + "</tr>")
        return (
            f"<table style='font-family:monospace;font-size:12px'><tr>{head}</tr>"
            + "".join(body)
            + "</table>"
        )

    # -- pictures ---------------------------------------------------------------------------
    def chart_png(self, col: Collector) -> bytes:
        """The loss and throughput charts, as PNG bytes."""
        return render_chart(self._chart_data(col))

    def picture(self, col: Collector, events: list[RunEvent], status: str) -> bytes:
        """The whole dashboard as one static PNG: for renderers that cannot show widgets."""
        from matplotlib.figure import Figure

        rows = self.rows[:_TABLE_ROWS_PNG]
        more = len(self.rows) - len(rows)
        height = 3.4 + 0.22 * (len(rows) + 1) + 0.2 * (min(len(events), 5) + bool(more)) + 0.5
        fig = Figure(figsize=(9, height), dpi=80)
        top = 1 - 0.55 / height
        fig.text(0.01, 1 - 0.25 / height, f"{self.title} · {status}", weight="bold", fontsize=11)
        fig.text(0.01, top, self.status.value, fontsize=9)
        chart_h = 2.6 / height
        loss_ax = fig.add_axes((0.07, top - chart_h - 0.05 / height, 0.55, chart_h - 0.3 / height))
        rate_ax = fig.add_axes((0.72, top - chart_h - 0.05 / height, 0.26, chart_h - 0.3 / height))
        plot(self._chart_data(col), loss_ax, rate_ax)
        table_top = top - chart_h - 0.35 / height
        table_h = 0.22 * (len(rows) + 1) / height
        if rows:
            tab_ax = fig.add_axes((0.01, table_top - table_h, 0.98, table_h))
            tab_ax.axis("off")
            cells = [_cells(r) for r in rows]
            table = tab_ax.table(
                cellText=cells,
                colLabels=list(_COLUMNS),
                loc="upper left",
                cellLoc="left",
                bbox=(0, 0, 1, 1),
            )
            table.auto_set_font_size(False)
            table.set_fontsize(7.5)
            for i, r in enumerate(rows, start=1):
                cell = table[i, 2]
                cell.set_facecolor(COLOURS.get(r["state"], "#555"))
                cell.get_text().set_color("white")
        y = table_top - table_h - 0.25 / height
        if more:
            fig.text(0.01, y, f"... and {more} more ranks", fontsize=8)
            y -= 0.2 / height
        for e in events[-5:]:
            rank = f" rank {e.rank}" if e.rank is not None else ""
            fig.text(
                0.01,
                y,
                f"{e.kind}{rank}: {e.message}"[:140],
                fontsize=8,
                color=_EVENT_COLOURS.get(e.kind, "#333"),
            )
            y -= 0.2 / height
        return figure_png(fig)

    def finish(self, col: Collector, events: list[RunEvent], status: str) -> bytes:
        """Final update; the output keeps the live widget and gains a static picture of it."""
        self.update(col, events, status, final=True)
        png = self.picture(col, events, status)
        self._pool.shutdown(wait=False)
        if self._handle is not None:
            self._handle.update(self._bundle(png), raw=True)
        return png
