"""A rank's output as it printed it: lines rewritten with \\r shown in place, in their final
state, the lines after them apart (the kernel's half; tests/integration/cells/test_output.py runs
tqdm on real engines)."""

from __future__ import annotations

import io

from front_end import Clock

from nbdist.notebook.board.lines import arrived, shown
from nbdist.notebook.run.output import LIVE_EVERY, RankOutput, StreamLines


def test_a_line_reads_as_a_terminal_leaves_it():
    assert shown("abc") == "abc"
    assert shown("\r 10%|#") == " 10%|#"
    assert shown("batch 1\rbatch 2") == "batch 2"
    assert shown("batch 3\r") == "batch 3"  # a trailing \r, as `end="\r"` leaves it
    assert shown("\r") == ""


def test_a_rewritten_line_ends_in_its_final_state_and_what_follows_stays_apart():
    lines = StreamLines()
    assert lines.feed("epoch 1\n") == [("epoch 1", False)]
    for i in range(11):
        assert lines.feed(f"\rbatch {i}") == []
    assert lines.live == "batch 10"
    # a print without \r after a rewritten line: a line of its own, not "batch 10WARNING"
    assert lines.feed("WARNING: loss diverged\n") == [
        ("batch 10", True),
        ("WARNING: loss diverged", False),
    ]
    assert lines.live is None
    # tqdm: redraws behind \r, then \n when it closes; \r\n ends a line too
    assert lines.feed("\r  0%|     | 0/3") == [] and lines.live == "  0%|     | 0/3"
    assert lines.feed("\r 33%|#    | 1/3\r100%|#####| 3/3\r\n") == [("100%|#####| 3/3", True)]
    # the trailing-\r style: each write redraws the line until a newline comes
    assert lines.feed("step 1\r") == [] and lines.feed("step 2\r") == []
    assert lines.live == "step 2"
    assert lines.feed("", final=True) == [("step 2", True)]
    # a partial plain line waits for its newline, and is a line at the end
    assert lines.feed("no newline") == [] and lines.live is None
    assert lines.feed("", final=True) == [("no newline", False)]


class _Shown:
    """Displays made by RankOutput: each one's states, in order."""

    def __init__(self):
        self.displays: list[list[str]] = []

    def __call__(self, text):
        states = [text]
        self.displays.append(states)
        return type("Handle", (), {"update": lambda _, t: states.append(t)})()


def test_redraws_update_one_display_a_few_times_a_second():
    clock, shows = Clock(), _Shown()
    out = {"stdout": io.StringIO(), "stderr": io.StringIO()}
    rank = RankOutput("[rank 1] ", out, shows, clock)
    rank.write("stdout", "start\n")
    for i in range(1001):  # a thousand redraws in one second
        rank.write("stderr", f"\r{i / 10:5.1f}%")
        clock.now += 0.001
    rank.write("stdout", "between\n")  # the other stream is a stream of its own
    rank.write("stderr", "\n")
    rank.write("stderr", "after\n")
    rank.close()
    assert out["stdout"].getvalue() == "[rank 1] start\n[rank 1] between\n"
    assert out["stderr"].getvalue() == "[rank 1] after\n"  # no redraw reached the stream
    [states] = shows.displays
    assert states[0] == "[rank 1]   0.0%" and states[-1] == "[rank 1] 100.0%"
    assert len(states) <= 1 + 1.0 / LIVE_EVERY + 1  # the first, one per period, the last


def test_what_arrived_survives_the_clients_rewrites():
    """ipyparallel's client keeps a rank's stream as text and rewrites it when a \\r comes (what
    precedes the last \\r on a line goes): the text read so far may shrink. What arrived is
    still found, a rewritten line as a redraw, no line twice."""
    seen = "epoch 1\n\repoch: 0%"
    assert arrived(seen, seen + " more") == " more"
    assert arrived(seen, "epoch 1\nepoch: 40%") == "\repoch: 40%"
    assert arrived(seen, "epoch 1\nepoch: 100%\nafter\n") == "\repoch: 100%\nafter\n"
    # a trailing \r left on an earlier line, rewritten later: that line is not read again
    seen = "a\rb\nc\r"
    assert arrived(seen, "b\nd\n") == "\rd\n"
    assert arrived(seen, seen) == ""
    lines = StreamLines()
    lines.feed("\repoch: 0%")
    assert lines.feed(arrived("\repoch: 0%", "epoch: 100%\n")) == [("epoch: 100%", True)]


def test_all_output_prints_lines_of_the_same_moment_in_rank_order():
    from nbdist.notebook.run.output import InRankOrder

    out, err, clock = io.StringIO(), io.StringIO(), Clock()
    order = InRankOrder({"stdout": out, "stderr": err}, clock=clock, hold=0.25)
    ranks = {r: RankOutput(f"[rank {r}] ", order.sink(r), clock=clock) for r in (2, 0, 1)}
    for r in (2, 1, 0):  # their messages arrived last rank first
        ranks[r].write("stdout", f"epoch 1 on {r}\nepoch 2 on {r}\n")
    ranks[1].write("stderr", "warning on 1\n")
    order.flush()
    assert out.getvalue() == ""  # held: another rank's line of the same moment may come
    clock.now = 0.25
    order.flush()
    assert out.getvalue().splitlines() == [
        f"[rank {r}] epoch {e} on {r}" for r in (0, 1, 2) for e in (1, 2)
    ]
    assert err.getvalue() == "[rank 1] warning on 1\n"
    ranks[2].write("stdout", "last\n")
    order.flush(force=True)  # the cell's end: nothing waits
    assert out.getvalue().endswith("[rank 2] last\n")
