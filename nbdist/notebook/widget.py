"""The dashboard's widget: state in Python, drawn by the browser (anywidget).

``static/dashboard.js`` is the whole front end (charts, table, events, logs: no dependencies,
nothing fetched at run time) and ``static/dashboard.css`` its look, in JupyterLab's theme
colours. Two synced traits carry what a view starts from: ``head`` (progress, status; tiny,
replaced at each update) and ``history`` (everything so far, decimated; refreshed every few
seconds). Between refreshes, ``Dashboard`` sends deltas as custom messages.
"""

from __future__ import annotations

from pathlib import Path

import anywidget
import traitlets

_STATIC = Path(__file__).with_name("static")


class DashboardWidget(anywidget.AnyWidget):
    """One run's live dashboard (see ``nbdist.notebook.dashboard.Dashboard``)."""

    _esm = _STATIC / "dashboard.js"
    _css = _STATIC / "dashboard.css"
    head = traitlets.Dict().tag(sync=True)
    history = traitlets.Dict().tag(sync=True)
