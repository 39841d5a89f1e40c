"""The sweep's board as a picture: one PNG (matplotlib, off-screen), kept in the output when the
sweep ends, for renderers without widgets (GitHub, nbconvert, a notebook reopened without a
kernel). Text is drawn as text: no TeX."""

from __future__ import annotations

from typing import Any

from ...telemetry.curves import Curve
from ...telemetry.format import fmt, fmt_duration

#: Each trial state's colour, as the browser's board draws it.
STATE_COLOURS = {
    "queued": "#757575",
    "running": "#1565c0",
    "done": "#2e7d32",
    "failed": "#c62828",
    "stopped": "#ef6c00",
}
_COLUMNS = (
    ("trial", "trial"),
    ("label", "values"),
    ("state", "state"),
    ("ranks", "ranks"),
    ("step", "step"),
    ("loss", "loss"),
    ("best", "best"),
    ("samples_per_s", "samples/s"),
    ("note", "note"),
)


def png(
    title: str,
    head: dict,
    rows: list[dict],
    loss: dict[int, Curve],
    rate: dict[int, Curve],
    best: int | None,
) -> bytes:
    """The board as one PNG: ``title``, its ``head``'s summary, each trial's ``loss`` and
    ``rate`` (samples/s) curves, and the table of ``rows`` (at most 16; the ``best`` starred)."""
    from matplotlib.figure import Figure

    from ..board.charts import figure_png

    by_trial = {r["trial"]: r for r in rows}
    shown = rows[:16]
    more = len(rows) - len(shown)
    table_in = 0.22 * (len(shown) + 1) if shown else 0.0
    height = 3.8 + table_in + 0.25 * bool(more) + 0.15  # inches, top to bottom

    def y(inches: float) -> float:  # inches from the top, as a figure fraction
        return 1 - inches / height

    fig = Figure(figsize=(10, height), dpi=80)
    fig.text(0.01, y(0.3), title, weight="bold", fontsize=11, parse_math=False)
    fig.text(0.01, y(0.55), _summary(head, by_trial), fontsize=9, parse_math=False)
    chart = (y(3.25), 2.4 / height)  # bottom, height: room below for ticks and labels
    loss_ax = fig.add_axes((0.07, chart[0], 0.5, chart[1]))
    rate_ax = fig.add_axes((0.65, chart[0], 0.33, chart[1]))
    _plot(loss_ax, loss, by_trial, "loss")
    _plot(rate_ax, rate, by_trial, "samples/s")
    rate_ax.set_ylim(bottom=0)
    if loss_ax.lines and len(by_trial) <= 12:
        legend = loss_ax.legend(fontsize=7, loc="upper right")
        for text in legend.get_texts():
            text.set_parse_math(False)
    if shown:
        box = (0.01, y(3.8 + table_in), 0.98, table_in / height)
        _table(fig, shown, best, box)
    if more:
        fig.text(0.01, y(3.8 + table_in + 0.2), f"... and {more} more trials", fontsize=8)
    return figure_png(fig)


def _plot(ax: Any, curves: dict[int, Curve], rows: dict[int, dict], ylabel: str) -> None:
    for t, curve in sorted(curves.items()):
        row = rows.get(t, {})
        state = row.get("state")
        ax.plot(
            curve.x,
            curve.y,
            color=f"C{t % 10}",  # matplotlib's tab10: the browser's palette
            lw=1.1,
            ls={"stopped": "--", "failed": ":"}.get(state, "-"),  # as the browser's
            alpha=0.4 if state == "failed" else 0.85,
            label=f"#{t} {row.get('label', '')}"[:40],
        )
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)


def _cell(key: str, value: Any) -> str:
    if value is None or value == "":
        return "–"
    if isinstance(value, float):
        return f"{value:,.0f}" if key == "samples_per_s" else fmt(value)
    if isinstance(value, int) and key == "step":
        return f"{value:,}"
    return str(value)[: 60 if key == "note" else 32]


def _table(fig: Any, rows: list[dict], best: int | None, box: tuple) -> None:
    from ..board.charts import state_table

    ax = fig.add_axes(box)
    ax.axis("off")
    text = [[_cell(k, r[k]) for k, _ in _COLUMNS] for r in rows]
    for line, r in zip(text, rows, strict=True):
        line[0] = f"#{r['trial']}" + (" ★" if r["trial"] == best else "")
    table = state_table(
        ax,
        text,
        [label for _, label in _COLUMNS],
        [STATE_COLOURS[r["state"]] for r in rows],
        [0.05, 0.2, 0.07, 0.06, 0.06, 0.07, 0.07, 0.08, 0.34],
    )
    for i, r in enumerate(rows, start=1):
        if r["trial"] == best:
            for j in range(len(_COLUMNS)):
                table[i, j].get_text().set_weight("bold")


def _summary(head: dict, rows: dict[int, dict]) -> str:
    parts = [f"{n} {s}" for s, n in head["counts"].items() if n]
    best = head["best"]
    if best is not None:
        parts.append(f"best #{best} {rows[best]['label']}: {fmt(rows[best]['best'])}")
    parts.append(fmt_duration(head["elapsed"]))
    return " · ".join(parts)
