"""The dashboard's widget: state in Python, drawn by the browser (anywidget).

Each board's front end is one ES module and one stylesheet, built by ``jlpm build`` (so by
``pip install``) from ``static/`` with what it imports (the sidebar's chart and number formats,
uPlot) into ``static/built/``: nothing is fetched at run time. Two synced traits carry what a
view starts from: ``head`` (progress, status; tiny, replaced at each update) and ``history``
(everything so far, decimated; refreshed every few seconds). Between refreshes the kernel sends
deltas as custom messages.
"""

from __future__ import annotations

import base64
from pathlib import Path

import anywidget
import traitlets

from ...errors import UsageError

_STATIC = Path(__file__).with_name("static")
_BUILT = _STATIC / "built"


def built(name: str) -> str:
    """The text of a built board file (``dashboard.js``, ``sweep.css``...), or a one-line error
    that says how to build it (a source checkout installed without its front end)."""
    path = _BUILT / name
    if not path.is_file():
        raise UsageError(
            f"nbdist's boards are not built ({path} is missing): reinstall nbdist "
            "(pip install -e .), or run `jlpm build:boards` in extension/"
        )
    return path.read_text()


class DashboardWidget(anywidget.AnyWidget):
    """One run's live dashboard (see ``nbdist.notebook.board.dashboard.Dashboard``)."""

    _esm = built("dashboard.js")
    _css = built("dashboard.css")
    head = traitlets.Dict().tag(sync=True)
    history = traitlets.Dict().tag(sync=True)


class SweepWidget(anywidget.AnyWidget):
    """A sweep's live board (see ``nbdist.notebook.sweeps.board.SweepBoard``): ``head`` (status,
    counts of trials by state, the best trial) and ``history`` as ``DashboardWidget``'s."""

    _esm = built("sweep.js")
    _css = built("sweep.css")
    head = traitlets.Dict().tag(sync=True)
    history = traitlets.Dict().tag(sync=True)


def bundle(
    widget: anywidget.AnyWidget | None, text: str, png: bytes | None = None, svg: str | None = None
) -> dict:
    """What a board's display holds: the widget's view, a text line, and (at its end) a
    picture of it, PNG or SVG, for renderers without widgets."""
    data: dict = {}
    if widget is not None:
        got = widget._repr_mimebundle_() or {}  # anywidget: (data, metadata)
        data = dict(got[0] if isinstance(got, tuple) else got)
    data["text/plain"] = text
    if png is not None:
        data["image/png"] = base64.b64encode(png).decode("ascii")
    if svg is not None:
        data["image/svg+xml"] = svg
    return data
