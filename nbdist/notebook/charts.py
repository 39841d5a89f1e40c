"""The run's charts, drawn off-screen with matplotlib's Agg into PNG bytes (no pyplot, no widgets).

The dashboard draws them on a background thread (``render_chart``) and into its static picture
(``plot``); ``nbdist.compare()`` shows its figures with ``figure_png``. matplotlib is imported on
first use, never at import.
"""

from __future__ import annotations

import io
from typing import Any


def warm_up() -> bytes:
    """Import matplotlib off the main thread while the cell starts (about half a second)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    from matplotlib.figure import Figure  # noqa: F401

    return b""


def plot(data: dict, loss_ax: Any, rate_ax: Any) -> None:
    """Loss per rank and its mean on ``loss_ax``, samples/s on ``rate_ax``.

    ``data``: ``{"ranks": [(rank, steps, losses)], "mean": (steps, losses),
    "rate": (seconds, samples_per_s)}``, a copy the drawing thread owns.
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


def render_chart(data: dict) -> bytes:
    """The dashboard's two charts of ``data`` (as for ``plot``), as PNG bytes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 2.8), dpi=80)
    loss_ax, rate_ax = fig.subplots(1, 2, gridspec_kw={"width_ratios": [2, 1]})
    plot(data, loss_ax, rate_ax)
    fig.tight_layout()
    return figure_png(fig)


def figure_png(fig: Any) -> bytes:
    """A matplotlib Figure as PNG bytes, without pyplot (safe from any thread)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
