"""The run's charts, drawn off-screen with matplotlib's Agg into PNG bytes (no pyplot, no widgets).

The dashboard's static picture (``dashboard_picture``, made once when a cell ends), the sweep's
and ``nbdist.compare()`` use them; the live boards are drawn by the browser. matplotlib is imported
on first use, never at import.
"""

from __future__ import annotations

import io
from typing import Any

from ...telemetry.format import MISSING, fmt

#: Metrics other than loss drawn in the picture (the live board has them all).
_PICTURE_METRICS = 6


def plot_metric(ax: Any, name: str, ranks: list[tuple[int, list, list]], mean: tuple) -> None:
    """One metric on ``ax``: each rank's curve (faint when there are many) and their mean."""
    many = len(ranks) > 8
    for rank, steps, values in ranks:
        if steps and len(ranks) <= 16:
            ax.plot(
                steps,
                values,
                lw=0.8,
                alpha=0.35 if many else 0.7,
                label=None if many else f"rank {rank}",
            )
    steps, values = mean
    if steps and (len(ranks) > 1 or not ax.lines):
        ax.plot(steps, values, color="black", lw=1.8, label="mean")
    ax.set_xlabel("step", fontsize=8)
    ax.set_title(name, fontsize=9, loc="left")
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)


_STATE_COLOURS = {
    "ok": "#2e7d32",
    "slow": "#ef6c00",
    "silent": "#9e9d24",
    "dead": "#c62828",
    "failed": "#c62828",
    "stopped": "#757575",
    "done": "#1976d2",
}
_COLUMNS = (
    ("rank", "rank", "d"),
    ("host", "host", ""),
    ("state", "state", ""),
    ("steps", "steps", ","),
    ("loss", "loss", ".4g"),
    ("step_ms", "step ms", ".0f"),
    ("cpu", "cpu %", ".0f"),
    ("rss_mb", "rss MB", ".0f"),
    ("gpu_util", "gpu %", ".0f"),
    ("gpu_mb", "gpu MB", ".0f"),
    ("comm", "comm %", ".0f"),
    ("pp", "pp", ""),
    ("dp", "dp", ""),
    ("tp", "tp", ""),
    ("stage", "stage", ""),
    ("idle", "idle %", ".0f"),
)
# a mesh's coordinates and a pipeline's columns: shown when some rank has a value
_OPTIONAL = ("pp", "dp", "tp", "stage", "idle")
_TABLE_ROWS = 16


def _cell(value: Any, spec: str) -> str:
    if value is None:
        return MISSING
    if isinstance(value, str) or not spec:
        return str(value)[:40]
    return fmt(value) if spec == ".4g" else format(value, spec)


def dashboard_picture(
    title: str,
    summary: str,
    metrics: dict[str, tuple[list[tuple[int, list, list]], tuple[list, list]]],
    rate: tuple[list, list],
    rows: list[dict],
    events: list[tuple[str, int | None, str]],
) -> bytes:
    """The whole dashboard as one PNG, made once when the cell ends, for renderers without
    widgets: loss and samples/s, up to six more metrics, the workers, the last events.
    ``metrics``: ``{name: ([(rank, steps, values)], (steps, mean))}``. Text from engines is
    drawn as text: TeX (``$...$``) is not interpreted."""
    from matplotlib.figure import Figure

    others = [n for n in metrics if n != "loss"][:_PICTURE_METRICS]
    grid_h = 2.0 * -(-len(others) // 3)  # rows of three small charts
    shown = rows[:_TABLE_ROWS]
    more = len(rows) - len(shown)
    height = 3.6 + grid_h + 0.22 * (len(shown) + 1) + 0.2 * (min(len(events), 5) + bool(more))
    height += 0.5
    fig = Figure(figsize=(9, height), dpi=80)

    def y(inches: float) -> float:  # inches from the top, as a figure fraction
        return 1 - inches / height

    fig.text(0.01, y(0.25), title, weight="bold", fontsize=11, parse_math=False)
    fig.text(0.01, y(0.55), summary, fontsize=9, parse_math=False)
    loss_ax = fig.add_axes((0.07, y(3.2), 0.55, 2.3 / height))
    ranks, mean = metrics.get("loss", ([], ([], [])))
    plot_metric(loss_ax, "loss", ranks, mean)
    if loss_ax.lines:
        loss_ax.legend(fontsize=7, loc="upper right")
    rate_ax = fig.add_axes((0.72, y(3.2), 0.26, 2.3 / height))
    rate_ax.plot(*rate, color="#1565c0")
    rate_ax.set_title("samples/s", fontsize=9, loc="left")
    rate_ax.set_xlabel("seconds", fontsize=8)
    rate_ax.tick_params(labelsize=7)
    rate_ax.set_ylim(bottom=0)
    rate_ax.grid(alpha=0.3)
    for i, name in enumerate(others):
        row, col = divmod(i, 3)
        ax = fig.add_axes((0.07 + col * 0.32, y(3.6 + 2.0 * row + 1.6), 0.26, 1.3 / height))
        plot_metric(ax, name, *metrics[name])
        ax.title.set_parse_math(False)
    table_top = y(3.75 + grid_h)
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
    at = table_top - table_h - 0.25 / height
    if more:
        fig.text(0.01, at, f"... and {more} more ranks", fontsize=8)
        at -= 0.2 / height
    for kind, rank, message in events[-5:]:
        who = f" rank {rank}" if rank is not None else ""
        fig.text(0.01, at, f"{kind}{who}: {message}"[:140], fontsize=8, parse_math=False)
        at -= 0.2 / height
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
