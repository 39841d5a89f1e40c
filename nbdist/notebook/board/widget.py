"""The boards' widgets: state in Python, drawn by the browser (anywidget); and whether any
front end will draw them at all.

Each board's front end is one ES module and one stylesheet, built by ``jlpm build`` (so by
``pip install``) from ``extension/src/boards/`` (TypeScript, beside the sidebar's, whose charts,
number formats and smoothing it shares; uPlot) into ``static/built/``: nothing is fetched at run
time. Two synced traits carry what a
view starts from: ``head`` (progress, status; tiny, replaced at each update) and ``history``
(everything so far, decimated; refreshed every few seconds). Between refreshes the kernel sends
deltas as custom messages.

``live()`` decides, when a board is shown, whether it is a widget updated while the cell runs or
only a picture at the end. A kernel cannot wait for a front end to say it draws: it reads the
front end's messages (a widget's included) only between cells, so an acknowledgement sent while
the board's cell runs arrives after it ended. The request that started the cell says it instead:
JupyterLab, Notebook 7 and VS Code send every cell with ``allow_stdin`` (a person is there to
answer ``input()``), whatever their tab's state; papermill, ``jupyter nbconvert --execute`` and
``jupyter execute`` (nbclient) send none, and render no widgets. ``NBDIST_BOARDS`` overrides it.
A board's front end acknowledges its model (``seen()``): once one has, this kernel's boards are
live whatever the request says. A front end that lost a message, or heard nothing for a while as
its run went, asks for the whole board again (``{"kind": "resend"}``): the kernel reads it between
cells, so a board that missed its run's messages is mended, finished board and picture included,
as soon as the cell ends.
"""

from __future__ import annotations

import base64
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anywidget
import traitlets

from ...errors import UsageError

_BUILT = Path(__file__).with_name("static") / "built"  # extension/build-boards.mjs writes it
#: ``NBDIST_BOARDS``: how boards are shown. ``live`` (a widget, updated while the cell runs),
#: ``picture`` (the final picture alone), ``auto`` or unset (live unless no front end draws).
MODES = ("auto", "live", "picture")
_seen = False  # a front end acknowledged a board of this kernel
_warned: set[str] = set()


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


def seen() -> bool:
    """Whether a front end has acknowledged a board of this kernel (read between cells)."""
    return _seen


def live() -> bool:
    """Whether a board shown now should be a live widget: ``NBDIST_BOARDS`` if set, else yes
    unless the cell was sent by a client that cannot answer ``input()`` (nbclient: papermill,
    nbconvert) and no front end has acknowledged a board here. Outside a kernel: yes."""
    mode = os.environ.get("NBDIST_BOARDS", "").strip().lower() or "auto"
    if mode not in MODES:
        if mode not in _warned:  # a board is shown mid-run: warn, never stop the run
            _warned.add(mode)
            print(
                f"nbdist: NBDIST_BOARDS={mode!r} is not one of {', '.join(MODES)}; "
                "boards follow the front end (auto)",
                file=sys.stderr,
                flush=True,
            )
        mode = "auto"
    if mode != "auto":
        return mode == "live"
    return _seen or _allows_stdin()


def _allows_stdin() -> bool:
    """``allow_stdin`` of the request the kernel is answering (True when there is none)."""
    try:
        from IPython import get_ipython

        kernel = getattr(get_ipython(), "kernel", None)
        request = kernel.get_parent() if kernel is not None else None
    except Exception:  # not a kernel as ipykernel makes them: assume a person is there
        return True
    content = (request or {}).get("content") or {}
    return content.get("allow_stdin", True) is not False


class BoardWidget(anywidget.AnyWidget):
    """What every board's widget has: ``head`` and ``history`` (see the module's docstring),
    and ``seen``, set when a front end acknowledges the model (between cells, at the soonest);
    ``resend``, when set, sends the whole board again (a front end asked: ``resends`` counts)."""

    head = traitlets.Dict().tag(sync=True)
    history = traitlets.Dict().tag(sync=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seen = False
        self.resend: Callable[[], None] | None = None
        self.resends = 0
        self.on_msg(_heard)


def _heard(widget: BoardWidget, content: Any, buffers: Any) -> None:
    global _seen
    kind = content.get("kind") if isinstance(content, dict) else None
    if kind == "seen":
        widget.seen = _seen = True
    elif kind == "resend" and widget.resend is not None:
        widget.resends += 1
        widget.resend()


class DashboardWidget(BoardWidget):
    """One run's live dashboard (see ``nbdist.notebook.board.dashboard.Dashboard``)."""

    _esm = built("dashboard.js")
    _css = built("dashboard.css")
    #: the finished board as SVG (``picture``), set at the end: a view that could not draw
    #: shows it under the line that says why
    picture = traitlets.Unicode("").tag(sync=True)


class SweepWidget(BoardWidget):
    """A sweep's live board (see ``nbdist.notebook.sweeps.board.SweepBoard``): ``head`` (status,
    counts of trials by state, the best trial) and ``history`` as ``DashboardWidget``'s."""

    _esm = built("sweep.js")
    _css = built("sweep.css")


def bundle(
    widget: anywidget.AnyWidget | None, text: str, png: bytes | None = None, svg: str | None = None
) -> dict:
    """What a board's display holds: the widget's view (none when no front end draws it), a
    text line, and (at its end) a picture of it, PNG or SVG, for renderers without widgets."""
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
