"""A rank's output as lines: what arrived since it was last read, its last complete lines, and
what shows of a line rewritten with carriage returns. Read by the collector (the board shows each
rank's last lines) and by the supervisor (the output under the cell)."""

from __future__ import annotations

import os

LOG_LINE = 500  # characters of a rank's output line shown on the board
LOG_SCAN = 1_000_000  # characters from the end of a rank's output looked at for its last lines


def arrived(seen: str, now: str) -> str:
    """What a rank wrote since ``seen``, given the text ipyparallel's client keeps of its stream
    ``now``. The client rewrites that text when a ``\r`` arrives (it keeps what follows the
    last one on a line), so it may shrink: a rewritten line comes back as a redraw, ``\r`` and
    the line as it now reads, after the lines already read."""
    if now.startswith(seen):
        return now[len(seen) :]
    start = seen.rfind("\n", 0, len(os.path.commonprefix([seen, now]))) + 1
    tail = now[start:]
    for _ in range(seen.count("\n", start)):  # lines read before, rewritten since: skipped
        cut = tail.find("\n")
        if cut < 0:
            return ""
        tail = tail[cut + 1 :]
    return "\r" + tail if tail else ""


def last_lines(text: str, n: int, limit: int, scan: int = LOG_SCAN) -> list[str]:
    """The last ``n`` complete lines of ``text`` as they show (``shown``), each clipped to
    about ``limit`` characters; found from the end, looking back at most ``scan`` characters
    (a line begun before that shows its end), and copying only what is kept."""
    out: list[str] = []
    end = text.rfind("\n")
    floor = max(0, end - scan)
    while end >= 0 and len(out) < n:
        i = text.rfind("\n", floor, end)
        start = i + 1 if i >= 0 else floor
        if end - start > limit:
            half = limit // 2
            cut = f" … ({end - start - 2 * half:,} characters left out) … "
            line = text[start : start + half] + cut + text[end - half : end]
        else:
            line = text[start:end]
        out.append(shown(line))
        if i < 0:  # the text's first line, or as far back as we look
            break
        end = i
    return out[::-1]


def shown(line: str) -> str:
    """What shows of a line rewritten with carriage returns: its last non-empty stretch."""
    parts = [p for p in line.split("\r") if p]
    return parts[-1] if parts else ""
