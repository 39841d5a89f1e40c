"""A cell whose rank printed megabytes leaves none of it in the kernel once it has ended: the
board keeps that rank's last lines, the cell's output its start and end."""

from __future__ import annotations

import gc
from collections import deque

from nbdist.config import CellOptions
from nbdist.notebook.board.lines import LOG_LINE
from nbdist.notebook.run import programs
from nbdist.notebook.run.observers import watch

LOUD = """import sys
if nbdist.rank() == 1:
    for _ in range(3):
        sys.stdout.write(("x" * 999 + "\\n") * 1000)
    print("the end")
1
"""


def _big_texts() -> int:
    """Characters in strings over 1 MB that some container in this process holds."""
    gc.collect()
    found = 0
    for o in gc.get_objects():  # type(), not isinstance: a lazy module's __class__ imports
        if type(o) is dict:
            values = o.values()
        elif type(o) in (list, tuple, deque):
            values = o
        else:
            continue
        found += sum(len(v) for v in list(values) if type(v) is str and len(v) > 1_000_000)
    return found


def test_a_rank_that_printed_3_mb_leaves_its_last_lines_only(cluster, no_front_end, capsys):
    opts = CellOptions(dashboard=True, name="loud")
    assert programs.run_watched(cluster, programs.cell(LOUD), opts) == 1
    assert _big_texts() == 0
    st = watch.last().collector.ranks[1]
    half = "x" * (LOG_LINE // 2)  # a board line keeps its start and end
    assert list(st.log)[-2:] == [f"{half} … (499 characters left out) … {half}", "the end"]
    # rank 0's output is the one printed under the cell, and it printed nothing
    assert "xxx" not in capsys.readouterr().out


def test_a_shown_rank_that_printed_3_mb_shows_its_start_and_end(cluster, no_front_end, capsys):
    opts = CellOptions(all_output=True, dashboard=False, name="loud, shown")
    programs.run_watched(cluster, programs.cell(LOUD), opts)
    out = capsys.readouterr().out.splitlines()
    assert _big_texts() == 0
    assert len(out) < 1200  # 1 MB shown as it came, 100 kB of the end, and the notes
    note = "[rank 1] nbdist: this rank printed over 1,000,000 characters; the rest is held back"
    assert [line.startswith(note) for line in out].index(True) == 1000  # 1 MB of lines first
    assert any(line.startswith("[rank 1] … (") and "lines" in line for line in out)
    assert out[-1] == "[rank 1] the end"
