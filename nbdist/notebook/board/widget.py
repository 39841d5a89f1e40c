"""The dashboard's widget: state in Python, drawn by the browser (anywidget).

``static/dashboard.js`` is the whole front end (charts, table, events, logs: no dependencies,
nothing fetched at run time) and ``static/dashboard.css`` its look, in JupyterLab's theme
colours. Two synced traits carry what a view starts from: ``head`` (progress, status; tiny,
replaced at each update) and ``history`` (everything so far, decimated; refreshed every few
seconds). Between refreshes, ``Dashboard`` sends deltas as custom messages.
"""

from __future__ import annotations

import base64
from pathlib import Path

import anywidget
import traitlets

_STATIC = Path(__file__).with_name("static")


def module(name: str) -> str:
    """A board's ES module: the helpers both boards share (``static/common.js``: curves by the
    kernel's rule, formats, ticks, text-only DOM helpers), then the board's own code."""
    return "\n".join((_STATIC / f).read_text() for f in ("common.js", name))


class DashboardWidget(anywidget.AnyWidget):
    """One run's live dashboard (see ``nbdist.notebook.board.dashboard.Dashboard``)."""

    _esm = module("dashboard.js")
    _css = _STATIC / "dashboard.css"
    head = traitlets.Dict().tag(sync=True)
    history = traitlets.Dict().tag(sync=True)


class SweepWidget(anywidget.AnyWidget):
    """A sweep's live board (see ``nbdist.notebook.sweeps.board.SweepBoard``): ``head`` (status,
    counts of trials by state, the best trial) and ``history`` as ``DashboardWidget``'s."""

    _esm = module("sweep.js")
    _css = _STATIC / "sweep.css"
    head = traitlets.Dict().tag(sync=True)
    history = traitlets.Dict().tag(sync=True)


def bundle(widget: anywidget.AnyWidget | None, text: str, png: bytes | None = None) -> dict:
    """What a board's display holds: the widget's view, a text line, and (at its end) a PNG
    picture of it for renderers without widgets."""
    data: dict = {}
    if widget is not None:
        got = widget._repr_mimebundle_() or {}  # anywidget: (data, metadata)
        data = dict(got[0] if isinstance(got, tuple) else got)
    data["text/plain"] = text
    if png is not None:
        data["image/png"] = base64.b64encode(png).decode("ascii")
    return data
