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

What a rank prints is bounded in the kernel and under the cell, however long the cell runs: a
line over ``LINE_LIMIT`` characters keeps its start and its end, with a note of how many were
left out between; past ``SHOWN_LIMIT`` characters printed, a rank's further lines are held
back, only the last ``TAIL_LIMIT`` characters of them kept, and shown when the cell ends after
one line that says how many were left out. ipyparallel's client's copy of the streams is bounded
too, and read a chunk at a time (``cluster.streams``).
"""

from __future__ import annotations

import re
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TextIO

from ...config import CellOptions
from ..board.lines import arrived, shown
from ..cluster.streams import Streams

LIVE_EVERY = 0.25  # seconds between updates of a line rewritten in place
LINE_LIMIT = 10_000  # characters of one line shown: its start and end, the middle counted
SHOWN_LIMIT = 1_000_000  # characters of a rank's lines printed under a cell as they come
TAIL_LIMIT = 100_000  # ...and of the last lines held back past that, shown when it ends
_CRLF = re.compile(r"\r+\n")
#: Where a line still being written had its middle left out, and how many characters: private
#: use characters, which no \r or \n split (``squeeze``).
_CUT = re.compile("\ue000(\\d+)\ue000")


def shows_output_of(opts: CellOptions, rank: int, main_rank: int) -> bool:
    """Is ``rank``'s output printed under the cell (``main_rank``: the cell's first)? The
    board shows the last lines of the others."""
    return not opts.quiet and (opts.all_output or rank == main_rank)


def squeeze(text: str, keep: int = LINE_LIMIT // 2, slack: int = LINE_LIMIT // 2) -> str:
    """A line bounded: past ``2 * keep + slack`` characters its middle goes, its start (up to
    where an earlier squeeze cut it) and its last ``keep`` characters stay, and a marker counts
    what went (``unsqueezed`` writes it as a note). ``slack`` spares a line still being written
    a squeeze at every write."""
    if len(text) <= 2 * keep + slack:
        return text
    m = _CUT.search(text)
    if m is None:
        head, dropped, rest = text[:keep], 0, text[keep:]
    else:  # the marker stands at most ``keep`` characters in: the head is what precedes it
        head, dropped, rest = text[: m.start()], int(m.group(1)), text[m.end() :]
    dropped += max(0, len(rest) - keep)
    return f"{head}\ue000{dropped}\ue000{rest[-keep:]}" if dropped else text


def unsqueezed(line: str) -> str:
    """A line as shown: at most ``LINE_LIMIT`` characters of it, its start and its end, with a
    note of how many were left out between."""
    return _CUT.sub(_note, squeeze(line, slack=0))


def _note(m: re.Match) -> str:
    return f" … ({int(m.group(1)):,} characters left out) … "


def _collapse(partial: str) -> str:
    """A line in progress without the redraws before its last one (what shows is the same):
    a bar redrawn for hours stays one redraw long."""
    body = partial.rstrip("\r")
    i = body.rfind("\r")
    return partial if i <= 0 else body[i:] + partial[len(body) :]


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
        self.partial = squeeze(_collapse(lines.pop()))
        for i, line in enumerate(lines):
            done.append((unsqueezed(shown(line)), was_live and i == 0))
        if lines:
            was_live = False
        if final and self.partial:
            done.append((unsqueezed(shown(self.partial)), was_live or "\r" in self.partial))
            self.partial = ""
        if "\r" in self.partial:
            self.live = unsqueezed(shown(self.partial)) or self.live
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
        self.printed = 0  # characters of lines printed (up to SHOWN_LIMIT)
        self.held: deque[tuple[str, str]] = deque()  # (stream, line) past it: the last ones
        self.held_chars = 0
        self.left_out = [0, 0]  # lines, characters held back and dropped: the middle
        self._holding = False

    def write(self, name: str, text: str, final: bool = False) -> None:
        """What the rank wrote to stream ``name`` since the last call (``final``: the last)."""
        printed = []
        for line, ends_live in self.lines[name].feed(text, final):
            if ends_live and name in self._displays:
                self._put(name, line)  # its display keeps the line's final state
                del self._displays[name], self._shown[name]
            else:  # a plain line, or a rewritten one that ended before it was shown
                printed.append(line)
        self._print(name, printed)
        if final:
            self._release()
        self.flush(name, force=final)

    def _print(self, name: str, lines: list[str]) -> None:
        """Print ``lines`` while the rank's output is under ``SHOWN_LIMIT``; hold back the
        rest, only the last ``TAIL_LIMIT`` characters of it kept."""
        now = []
        for line in lines:
            size = len(line) + 1
            if not self._holding and self.printed + size <= SHOWN_LIMIT:
                self.printed += size
                now.append(line)
                continue
            if not self._holding:
                self._holding = True
                now.append(
                    f"nbdist: this rank printed over {SHOWN_LIMIT:,} characters; the rest is "
                    "held back, and its last lines are shown when the cell ends"
                )
            self.held.append((name, line))
            self.held_chars += size
            while self.held_chars > TAIL_LIMIT and len(self.held) > 1:
                _, gone = self.held.popleft()
                self.held_chars -= len(gone) + 1
                self.left_out[0] += 1
                self.left_out[1] += len(gone) + 1
        self._emit(name, now)

    def _release(self) -> None:
        """The end of the cell: the lines held back, after a line saying what was left out."""
        if not self.held:
            return
        lines, chars = self.left_out
        if lines:
            left = f"… ({lines:,} lines, {chars:,} characters, left out) …"
            self._emit(self.held[0][0], [left])
        while self.held:
            name = self.held[0][0]
            run = []
            while self.held and self.held[0][0] == name:
                run.append(self.held.popleft()[1])
            self._emit(name, run)
        self.held_chars, self.left_out = 0, [0, 0]

    def _emit(self, name: str, lines: list[str]) -> None:
        if lines:
            out = self.targets[name]
            out.write("".join(f"{self.prefix}{line}\n" for line in lines))
            out.flush()

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


class InRankOrder:
    """Many ranks' lines (``--all-output``) printed in rank order: what the ranks print waits
    up to ``hold`` seconds, then goes out rank by rank (each rank's own lines in their order),
    so lines printed at about the same moment read rank 0, 1, 2 whatever order their messages
    arrived in. ``sink(rank)`` is the targets a rank's ``RankOutput`` writes to; ``flush()``
    prints what is due (``force``: everything, at the cell's end)."""

    def __init__(
        self,
        targets: dict[str, TextIO] | None = None,
        clock: Callable[[], float] = time.monotonic,
        hold: float = LIVE_EVERY,
    ):
        self.targets = targets or {"stdout": sys.stdout, "stderr": sys.stderr}
        self.clock = clock
        self.hold = hold
        self._waiting: list[tuple[int, str, str]] = []  # (rank, stream, text)
        self._since = 0.0

    def sink(self, rank: int) -> dict[str, Any]:
        """The streams rank ``rank``'s output writes to."""
        return {name: _Sink(self, rank, name) for name in ("stdout", "stderr")}

    def put(self, rank: int, stream: str, text: str) -> None:
        if not self._waiting:
            self._since = self.clock()
        self._waiting.append((rank, stream, text))

    def flush(self, force: bool = False) -> None:
        if not self._waiting or (not force and self.clock() - self._since < self.hold):
            return
        waiting, self._waiting = sorted(self._waiting, key=lambda w: w[0]), []
        for _, stream, text in waiting:
            self.targets[stream].write(text)
        for out in self.targets.values():
            out.flush()


class _Sink:
    """One rank's stream as ``InRankOrder`` takes it."""

    def __init__(self, order: InRankOrder, rank: int, stream: str) -> None:
        self.order, self.rank, self.stream = order, rank, stream

    def write(self, text: str) -> None:
        self.order.put(self.rank, self.stream, text)

    def flush(self) -> None:
        pass


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


#: Rich outputs a rank's display() may show under the cell: engines' text is shown as text.
_SAFE_MIME = ("text/plain", "image/png", "image/jpeg", "image/svg+xml")


class RankStreams:
    """One rank's output as a running cell reads it: its streams as last read, the rich
    outputs already seen, and, when its output is shown (``label``, else None), the
    ``RankOutput`` that writes it under the cell."""

    def __init__(self, label: str | None, targets: dict[str, Any] | None = None):
        self.seen = {"stdout": "", "stderr": ""}
        self.outputs = 0
        self.output = RankOutput(label, targets) if label is not None else None

    def read(self, metadata: dict, final: bool = False) -> bool:
        """Take what the rank sent since the last read (``metadata``: ipyparallel's, filled in
        by its client; fanout's requests' a ``Streams``, which hands over each chunk once),
        showing it when shown; whether any text arrived."""
        news = False
        for name in ("stdout", "stderr"):
            new = self._arrived(metadata, name)
            news = news or bool(new)
            if self.output is not None and (new or final):
                self.output.write(name, new, final)
        if self.output is not None:
            self.output.flush()  # a line rewritten in place: its latest state, when due
        outputs = metadata.get("outputs", [])
        if self.output is not None:
            for out in outputs[self.outputs :]:
                _republish(out)
        self.outputs = len(outputs)
        return news

    def _arrived(self, metadata: dict, name: str) -> str:
        if isinstance(metadata, Streams):  # the chunks since the last take: none read twice
            return metadata.take(name)
        text = metadata.get(name) or ""  # another client's record: the whole stream, diffed
        new = arrived(self.seen[name], text)
        self.seen[name] = text
        return new


def _republish(out: dict) -> None:
    from IPython import get_ipython

    ip = get_ipython()
    data = {k: v for k, v in out.get("data", {}).items() if k in _SAFE_MIME}
    if ip is not None and data:
        ip.display_pub.publish(data=data, metadata=out.get("metadata", {}))
