"""The run's charts, drawn off-screen with matplotlib's Agg into PNG bytes (no pyplot, no widgets).

The dashboard's static picture (``dashboard_picture``, made once when a cell ends) and
``nbdist.compare()`` use them; the live dashboard is drawn by the browser. matplotlib is imported
on first use, never at import.
"""

from __future__ import annotations

import io
from typing import Any


def plot(data: dict, loss_ax: Any, rate_ax: Any) -> None:
    """Loss per rank and its mean on ``loss_ax``, samples/s on ``rate_ax``.

    ``data``: ``{"ranks": [(rank, steps, losses)], "mean": (steps, losses),
    "rate": (seconds, samples_per_s)}``.
    """
    ranks = data["ranks"]
    many = len(ranks) > 8
    for rank, steps, values in ranks:
        if steps:
            loss_ax.plot(
                steps,
                values,
                lw=0.8,
                alpha=0.35 if many else 0.7,
                label=None if many else f"rank {rank}",
            )
    steps, values = data["mean"]
    if steps:
        loss_ax.plot(steps, values, color="black", lw=1.8, label="mean")
    loss_ax.set_xlabel("step")
    loss_ax.set_ylabel("loss")
    loss_ax.grid(alpha=0.3)
    if loss_ax.lines:
        loss_ax.legend(fontsize=7, loc="upper right")
    t, v = data["rate"]
    rate_ax.plot(t, v, color="#1565c0")
    rate_ax.set_xlabel("seconds")
    rate_ax.set_ylabel("samples/s")
    rate_ax.set_ylim(bottom=0)
    rate_ax.grid(alpha=0.3)


_STATE_COLOURS = {"ok": "#2e7d32", "slow": "#ef6c00", "silent": "#9e9d24", "dead": "#c62828"}
_COLUMNS = (
    ("rank", "rank", "d"),
    ("host", "host", ""),
    ("state", "state", ""),
    ("step", "step", "d"),
    ("loss", "loss", ".4g"),
    ("step_ms", "step ms", ".0f"),
    ("cpu", "cpu %", ".0f"),
    ("rss_mb", "rss MB", ".0f"),
    ("gpu_util", "gpu %", ".0f"),
    ("gpu_mb", "gpu MB", ".0f"),
    ("comm", "comm %", ".0f"),
    ("stage", "stage", ""),
    ("idle", "idle %", ".0f"),
)
_OPTIONAL = ("stage", "idle")  # a pipeline's columns: shown when some rank has a value
_TABLE_ROWS = 16


def _cell(value: Any, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, str) or not spec:
        return str(value)[:40]
    return format(value, spec)


def dashboard_picture(
    title: str,
    summary: str,
    ranks: list[tuple[int, list, list]],
    mean: tuple[list, list],
    rate: tuple[list, list],
    rows: list[dict],
    events: list[tuple[str, int | None, str]],
) -> bytes:
    """The whole dashboard as one PNG, made once when the cell ends, for renderers without
    widgets. Text from engines is drawn as text: TeX (``$...$``) is not interpreted."""
    from matplotlib.figure import Figure

    shown = rows[:_TABLE_ROWS]
    more = len(rows) - len(shown)
    height = 3.6 + 0.22 * (len(shown) + 1) + 0.2 * (min(len(events), 5) + bool(more)) + 0.5
    fig = Figure(figsize=(9, height), dpi=80)
    top = 1 - 0.55 / height
    fig.text(0.01, 1 - 0.25 / height, title, weight="bold", fontsize=11, parse_math=False)
    fig.text(0.01, top, summary, fontsize=9, parse_math=False)
    chart_h = 2.6 / height
    loss_ax = fig.add_axes((0.07, top - chart_h - 0.05 / height, 0.55, chart_h - 0.3 / height))
    rate_ax = fig.add_axes((0.72, top - chart_h - 0.05 / height, 0.26, chart_h - 0.3 / height))
    plot({"ranks": ranks, "mean": mean, "rate": rate}, loss_ax, rate_ax)
    table_top = top - chart_h - 0.55 / height
    table_h = 0.22 * (len(shown) + 1) / height
    if shown:
        tab_ax = fig.add_axes((0.01, table_top - table_h, 0.98, table_h))
        tab_ax.axis("off")
        cols = [
            c
            for c in _COLUMNS
            if c[0] not in _OPTIONAL or any(r.get(c[0]) is not None for r in shown)
        ]
        state_table(
            tab_ax,
            [[_cell(r.get(k), spec) for k, _, spec in cols] for r in shown],
            [label for _, label, _ in cols],
            [_STATE_COLOURS.get(r["state"], "#555") for r in shown],
        )
    y = table_top - table_h - 0.25 / height
    if more:
        fig.text(0.01, y, f"... and {more} more ranks", fontsize=8)
        y -= 0.2 / height
    for kind, rank, message in events[-5:]:
        who = f" rank {rank}" if rank is not None else ""
        fig.text(0.01, y, f"{kind}{who}: {message}"[:140], fontsize=8, parse_math=False)
        y -= 0.2 / height
    return figure_png(fig)


def state_table(
    ax: Any, text: list[list[str]], labels: list[str], colours: list[str], widths=None
) -> Any:
    """A table of rows whose third column is a state, on its colour (runs' ranks, sweeps'
    trials); text is drawn as given (no math), in a small font."""
    table = ax.table(
        cellText=text,
        colLabels=labels,
        colWidths=widths,
        loc="upper left",
        cellLoc="left",
        bbox=(0, 0, 1, 1),
    )
    table.auto_set_font_size(False)
    table.set_fontsize(7.5)
    for cell in table.get_celld().values():
        cell.get_text().set_parse_math(False)
    for i, colour in enumerate(colours, start=1):
        cell = table[i, 2]
        cell.set_facecolor(colour)
        cell.get_text().set_color("white")
    return table


def figure_png(fig: Any) -> bytes:
    """A matplotlib Figure as PNG bytes, without pyplot (safe from any thread)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
