"""Output as each rank printed it, in a real kernel on real engines: tqdm's bar (tqdm.auto, as
training loops and Hugging Face use it) moves in place and ends in its final state; a print
after a ``\\r`` progress line stays a line of its own; ``--all-output`` keeps the labels."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("tqdm")


TQDM = """%%distributed{flags}
import time
from tqdm.auto import tqdm
for i in tqdm(range(20), desc="epoch", ncols=60):
    time.sleep(0.05)
print("after the bar")
"""


def _bars(res) -> dict[str, list[str]]:
    return {k: v for k, v in res.in_place.items() if any("epoch" in t for t in v)}


def test_tqdm_moves_in_place_and_ends_in_its_final_state(ready):
    res = ready.ok(TQDM.format(flags=""))
    [states] = _bars(res).values()  # rank 0's bar: one output, updated in place
    assert len(states) >= 3, states  # it moved while the cell ran
    assert re.match(r"epoch: 100%\|\S+\| 20/20 ", states[-1]), states[-1]
    assert "epoch" not in res.stderr  # no redraw reached the stream
    assert res.stdout.count("after the bar") == 1


def test_all_output_keeps_each_ranks_bar_and_label(ready):
    res = ready.ok(TQDM.format(flags=" --all-output"))
    finals = sorted(states[-1] for states in _bars(res).values())
    assert [f[:21] for f in finals] == ["[rank 0] epoch: 100%|", "[rank 1] epoch: 100%|"]
    assert sorted(re.findall(r"\[rank \d\] after the bar", res.stdout)) == [
        "[rank 0] after the bar",
        "[rank 1] after the bar",
    ]


def test_a_print_after_a_progress_line_is_a_line_of_its_own(ready):
    res = ready.ok(
        '%%distributed\nfor i in range(11):\n    print(f"\\rbatch {i}", end="")\n'
        'print("WARNING: loss diverged")\n'
    )
    assert [states[-1] for states in res.in_place.values()] in (["batch 10"], [])
    lines = res.stdout.splitlines()
    assert "WARNING: loss diverged" in lines and not any("10WARNING" in s for s in lines)
    # the progress line ended in its final state: in place, or (drawn too fast to be shown in
    # place) as a line of the stream
    assert res.in_place or "batch 10" in lines


def test_a_rank_says_whether_the_cell_printed_and_an_unknown_stream_counts_as_printed(cluster):
    """The kernel waits for a rank's output after its reply (it travels apart, a millisecond or
    more behind) only where the rank printed or displayed something: the rank must not say it
    did not when it did, whatever the code did to its streams."""
    from nbdist.notebook.cluster import fanout
    from nbdist.notebook.run import programs
    from nbdist.protocol import CellRequest
    from nbdist.worker import api

    def printed(source: str) -> bool:
        request = CellRequest(program=programs.cell(source), telemetry=False)
        got = fanout.call(cluster.client, {0: cluster.slots[0].engine_id}, api.run_cell, request,
                          timeout=60)  # fmt: skip
        got.check("the cell")
        return got.values[0].printed

    assert printed("x = 1") is False
    assert printed("print('hi', end='')") is True
    assert printed("import sys; sys.stderr.write('w')") is True
    assert printed("from IPython.display import display, HTML; display(HTML('<b>b</b>'))") is True
    assert printed("from IPython.display import clear_output; clear_output()") is True
    # a stream replaced by the code: its writes are not counted, so it is taken to have printed
    assert printed("import io, sys; _keep = sys.stdout; sys.stdout = io.StringIO()") is True
    assert printed("import sys; sys.stdout = _keep") is True  # replaced when it began
    assert printed("y = 2") is False
