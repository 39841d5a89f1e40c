"""The line a start shows while it waits: how many engines are up, and what the rest wait for.

A large cluster takes a while to start (256 engines on 2 cores: a minute and more), and a cell
that says nothing meanwhile looks hung. ``StartLine`` is one line under the cell, updated in
place (an IPython display, at most a few times a second), e.g. ``start: 143/256 engines
registered; waiting for 113 (forked, starting their kernels)``; shown only once a start has taken
``SHOW_AFTER`` seconds (a small cluster's start shows nothing), and left saying how the start
ended. Outside a kernel (a script) it shows nothing. ``wait_counted`` waits for many replies
and keeps the line counting them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

#: Seconds a start runs before its line appears.
SHOW_AFTER = 1.0
_EVERY = 0.25  # seconds between updates of the line
_LOOK = 0.05  # seconds between looks at replies while counting them


class StartLine:
    """One live line for a start (see the module's text)."""

    def __init__(self, shown: bool = True, clock=time.monotonic) -> None:
        self._open = shown  # says nothing once done (or never, when not shown)
        self._clock = clock
        self._began = clock()
        self._handle: Any = None
        self._said = ""
        self._shown_at = 0.0
        self.last = ""  # the latest text, shown or not (tests read it)

    def say(self, text: str, now: bool = False) -> None:
        """``start: text`` is the line from now on (shown when due; at once with ``now``)."""
        self.last = f"start: {text}"
        if not self._open:
            return
        t = self._clock()
        if t - self._began < SHOW_AFTER or (not now and t - self._shown_at < _EVERY):
            return
        self._show(self.last)
        self._shown_at = t

    def done(self, text: str) -> None:
        """The start ended: the line (if shown) says how, with the time it took."""
        self.last = f"start: {text} ({self._clock() - self._began:.1f} s)"
        if self._open and self._handle is not None:
            self._show(self.last)
        self._open = False

    def _show(self, text: str) -> None:
        if text == self._said:
            return
        self._said = text
        if self._handle is None:
            self._handle = _display(text)
        elif self._handle is not False:
            self._handle.update({"text/plain": text}, raw=True)


def _display(text: str) -> Any:
    """A display handle under the running cell, or False outside a kernel."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None:
        return False
    return display({"text/plain": text}, raw=True, display_id=True) or False


def wait_counted(pending: Mapping[Any, Any], timeout: float, line: StartLine, what: str) -> None:
    """Wait (up to ``timeout`` s) until every reply in ``pending`` is in, the line saying
    ``what: k/n``; the replies are read afterwards (``fanout.wait``)."""
    deadline = time.monotonic() + timeout
    n = len(pending)
    while time.monotonic() < deadline:
        waiting = [ar for ar in pending.values() if not ar.ready()]
        line.say(f"{what}: {n - len(waiting)}/{n}")
        if not waiting:
            return
        waiting[0].wait(_LOOK)
