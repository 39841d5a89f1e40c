"""A rank's output as the rank printed it, in the notebook.

Complete lines go to the cell's stdout or stderr (labelled ``[rank N]`` under ``--all-output``).
A line the rank rewrites with ``\\r`` (tqdm's bar, ``print(..., end="\\r")``, Keras-style
progress) is shown in place instead: one display per rank and stream, updated as the line
changes (at most ``LIVE_EVERY`` seconds apart, and once more when it ends), so a bar moves and
stays in its final state, and the thousands of redraws of a long run cost one output, not
thousands. Text written after a rewritten line without a ``\\r`` of its own starts a line of its
own (``batch 10`` then ``WARNING: ...`` are two lines, not ``batch 10WARNING: ...``).

A line reads as a terminal would leave it: ``\\r\\n`` ends it, and what shows is the last
non-empty stretch after a ``\\r`` (tqdm pads each redraw to the width of the last).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from ..board.collector import shown

LIVE_EVERY = 0.25  # seconds between updates of a line rewritten in place
_CRLF = re.compile(r"\r+\n")


class StreamLines:
    """One rank's stream, split into lines as they are completed.

    ``feed(text)`` returns the lines completed by ``text``, each with a flag that says it ends a
    line that was being rewritten in place; ``live`` is then the state of the line being
    rewritten now, or None.
    """

    def __init__(self) -> None:
        self.partial = ""  # text after the last newline
        self.live: str | None = None  # what shows of the line being rewritten, if one is

    def feed(self, text: str, final: bool = False) -> list[tuple[str, bool]]:
        """Take the rank's next ``text``; ``final``: the stream has ended."""
        done: list[tuple[str, bool]] = []
        if (
            self.live is not None
            and text
            and not (text.startswith(("\r", "\n")) or self.partial.endswith("\r"))
        ):
            done.append((self.live, True))  # new text, not a redraw: the rewritten line ended
            self.partial, self.live = "", None
        was_live = self.live is not None
        lines = _CRLF.sub("\n", self.partial + text).split("\n")
        self.partial = lines.pop()
        for i, line in enumerate(lines):
            done.append((shown(line), was_live and i == 0))
        if lines:
            was_live = False
        if final and self.partial:
            done.append((shown(self.partial), was_live or "\r" in self.partial))
            self.partial = ""
        if "\r" in self.partial:
            self.live = shown(self.partial) or self.live
        else:
            self.live = None
        return done


class RankOutput:
    """One rank's stdout and stderr shown in the cell: lines printed, rewritten lines in place.

    ``write(name, text)`` takes what arrived; ``flush()`` updates the lines shown in place when
    due (every call to write does too); ``close()`` shows every line in its final state.
    ``show(text)`` makes a display and returns an object with ``update(text)``: IPython's by
    default (tests pass their own).
    """

    def __init__(
        self,
        prefix: str = "",
        targets: dict[str, TextIO] | None = None,
        show: Callable[[str], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.prefix = prefix
        self.targets = targets or {"stdout": sys.stdout, "stderr": sys.stderr}
        self._show = show or _display
        self.clock = clock
        self.lines = {name: StreamLines() for name in ("stdout", "stderr")}
        self._displays: dict[str, Any] = {}  # stream -> the display of its rewritten line
        self._shown: dict[str, str] = {}  # stream -> the text that display shows
        self._due: dict[str, float] = {}

    def write(self, name: str, text: str, final: bool = False) -> None:
        """What the rank wrote to stream ``name`` since the last call (``final``: the last)."""
        printed = []
        for line, ends_live in self.lines[name].feed(text, final):
            if ends_live and name in self._displays:
                self._put(name, line)  # its display keeps the line's final state
                del self._displays[name], self._shown[name]
            else:  # a plain line, or a rewritten one that ended before it was shown
                printed.append(line)
        if printed:
            out = self.targets[name]
            out.write("".join(f"{self.prefix}{line}\n" for line in printed))
            out.flush()
        self.flush(name, force=final)

    def flush(self, name: str | None = None, force: bool = False) -> None:
        """Show the rewritten lines' latest states, at most every ``LIVE_EVERY`` seconds."""
        now = self.clock()
        for stream in (name,) if name else tuple(self.lines):
            live = self.lines[stream].live
            if live is None or self._shown.get(stream) == live:
                continue
            if not force and now < self._due.get(stream, 0.0):
                continue
            self._due[stream] = now + LIVE_EVERY
            self._put(stream, live)

    def close(self) -> None:
        """The end of the cell: every line in its final state."""
        for name in self.lines:
            self.write(name, "", final=True)

    def _put(self, stream: str, line: str) -> None:
        text = self.prefix + line
        handle = self._displays.get(stream)
        if handle is None:
            self._displays[stream] = self._show(text)
        else:
            handle.update(text)
        self._shown[stream] = line


class _Display:
    """An IPython display of one line of text, updated in place."""

    def __init__(self, text: str) -> None:
        from IPython.display import display

        self.handle = display({"text/plain": text}, raw=True, display_id=True)

    def update(self, text: str) -> None:
        if self.handle is not None:
            self.handle.update({"text/plain": text}, raw=True)


def _display(text: str) -> _Display:
    return _Display(text)
