"""What the kernel keeps of a rank's output and of a cell's value is bounded, however much the
rank prints: the start and the end are kept, with one line (or note) of what was left out."""

from __future__ import annotations

import io
import sys
from collections import deque
from types import SimpleNamespace

from nbdist.notebook.board.collector import Collector
from nbdist.notebook.board.lines import LOG_LINE
from nbdist.notebook.run import output
from nbdist.notebook.run.output import RankOutput, StreamLines
from nbdist.worker.values import MAX_REPR_CHARS, portable

MB = 1_000_000


def _rank(printed: dict[str, io.StringIO]) -> RankOutput:
    return RankOutput("", printed, show=lambda text: SimpleNamespace(update=lambda t: None))


def _held(out: RankOutput) -> int:
    """Characters the rank's output holds now."""
    lines = out.lines.values()
    return out.held_chars + sum(len(s.partial) + len(s.live or "") for s in lines)


def test_a_rank_that_prints_50_mb_keeps_its_start_and_end_and_says_what_was_left_out():
    printed = {"stdout": io.StringIO(), "stderr": io.StringIO()}
    out = _rank(printed)
    line = "x" * 99  # and its newline: 100 characters
    chunk = "".join(f"{line}\n" for _ in range(10_000))  # 1 MB, as a poll may bring it
    most = 0
    for _ in range(50):
        out.write("stdout", chunk)
        most = max(most, _held(out))
    out.write("stdout", "the last line\n")
    out.write("stdout", "", final=True)
    text = printed["stdout"].getvalue()
    assert most <= output.TAIL_LIMIT + 100  # the tail held back: never more
    assert len(text) < output.SHOWN_LIMIT + output.TAIL_LIMIT + 1000
    lines = text.splitlines()
    shown = output.SHOWN_LIMIT // 100
    assert lines[:shown] == [line] * shown  # the start, as printed
    assert lines[shown].startswith("nbdist: this rank printed over 1,000,000 characters")
    left = 50 * 10_000 - shown - (output.TAIL_LIMIT // 100 - 1)
    assert lines[shown + 1] == f"… ({left:,} lines, {left * 100:,} characters, left out) …"
    assert lines[-1] == "the last line" and set(lines[shown + 2 : -1]) == {line}


def test_a_50_mb_line_keeps_its_start_and_end_with_a_note_of_the_middle():
    printed = {"stdout": io.StringIO(), "stderr": io.StringIO()}
    out = _rank(printed)
    out.write("stdout", "START")
    for _ in range(50):
        out.write("stdout", "y" * MB)
        assert _held(out) <= 2 * output.LINE_LIMIT
    out.write("stdout", "END\n")
    [shown] = printed["stdout"].getvalue().splitlines()
    keep = output.LINE_LIMIT // 2
    left = 50 * MB + 8 - 2 * keep
    assert (
        shown == f"START{'y' * (keep - 5)} … ({left:,} characters left out) … {'y' * (keep - 3)}END"
    )


def test_a_bar_redrawn_without_end_holds_one_redraw():
    lines = StreamLines()
    for i in range(200_000):
        assert lines.feed(f"\r{i:>8}/200000") == []
    assert lines.live == "  199999/200000" and len(lines.partial) <= 20
    assert lines.feed("\n") == [("  199999/200000", True)]


def test_the_board_keeps_the_last_lines_not_the_output():
    col = Collector([0])
    text = "".join(f"line {i}\n" for i in range(5 * MB // 10)) + "z" * (MB // 2) + "\npartial"
    rank = SimpleNamespace(metadata={"stdout": text, "data": {}}, outcome=None, pid=1)
    before = sys.getrefcount(text)
    col.poll({0: rank})
    st = col.ranks[0]
    assert sys.getrefcount(text) == before  # no reference kept: the text goes with the cell
    log = list(st.log)
    assert log[:-1] == [f"line {i}" for i in range(5 * MB // 10 - 4, 5 * MB // 10)]
    assert len(log[-1]) <= LOG_LINE + 50 and "characters left out" in log[-1]
    assert isinstance(st.log, deque) and len(log) == st.log.maxlen


def test_a_values_repr_keeps_its_start_and_end():
    packed = portable(list(range(1_000_000)))
    assert packed.pickle is not None  # the value itself still travels whole
    assert len(packed.repr) <= MAX_REPR_CHARS + 60
    assert packed.repr.startswith("[0, 1, 2") and packed.repr.endswith("999998, 999999]")
    assert "characters left out" in packed.repr
    assert portable("short").repr == "'short'"
