"""matplotlib's Agg into PNG bytes (no pyplot, no widgets), for the pictures a person asks for:
the sweep board's and ``nbdist.compare()``'s. The live boards are drawn by the browser, and the
dashboard's picture is an SVG written as text (``picture``). matplotlib is imported on first
use, never at import.
"""

from __future__ import annotations

import io
from typing import Any


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
