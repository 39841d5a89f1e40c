"""The sweep board's kernel half: the trials table as data, deltas that carry only what changed,
bounded curves and messages, and the static picture at the end. The widget is real (anywidget);
only the front end is absent."""

from __future__ import annotations

import base64
import json
import math

import pytest
from front_end import Clock

from nbdist.notebook.sweeps.board import RATE, SweepBoard
from nbdist.telemetry.series import MAX_METRICS


@pytest.fixture
def shown(no_front_end):
    """A board with its widget and a clock of its own; its messages to the browser are kept."""
    board = SweepBoard("sweep <b>1</b>")
    clock = board.clock = Clock(100.0)
    board.show()
    sent = []
    board.widget.send = lambda content, buffers=None: sent.append(content)
    return board, clock, sent, no_front_end.handle, no_front_end.shown


def test_rows_are_the_table_by_trial_id():
    board = SweepBoard("s")
    board.set_trial(2, label="lr=0.01, width=32", state="queued")
    board.set_trial(0, label="lr=0.1, width=32", state="running", ranks="0", step=3, loss=0.5)
    board.set_trial(1, label="lr=0.1, width=64", state="stopped", loss=float("nan"), best=0.7)
    board.set_trial(0, label="lr=0.1, width=32", state="done", ranks="0", step=9, best=0.25)
    assert [r["trial"] for r in board.rows] == [0, 1, 2]
    assert board.rows[0] == {
        "trial": 0,
        "label": "lr=0.1, width=32",
        "state": "done",
        "ranks": "0",
        "step": 9,
        "loss": None,
        "best": 0.25,
        "samples_per_s": None,
        "note": "",
    }
    assert board.rows[1]["loss"] == "nan"  # text: JSON has no NaN
    assert board.best_trial() == 0
    with pytest.raises(ValueError, match="not 'finished'"):
        board.set_trial(3, label="x", state="finished")
    board.update(force=True)  # not shown: nothing to send, and no error


def test_show_puts_a_widget_under_the_cell(shown):
    board, _, _, _, bundles = shown
    ((data, kw),) = bundles
    assert kw == {"raw": True, "display_id": True}
    assert "application/vnd.jupyter.widget-view+json" in data
    assert data["text/plain"] == "nbdist sweep: sweep <b>1</b>"
    assert board.widget.head["title"] == "sweep <b>1</b>"  # text; the browser sets textContent
    assert board.widget.history["seq"] == 1 and board.widget.history["rows"] == []


def test_updates_send_only_what_changed_and_at_most_four_a_second(shown):
    board, clock, sent, _, _ = shown
    for t in range(3):
        board.set_trial(t, label=f"lr={10**-t}", state="queued")
    board.set_trial(0, label="lr=1", state="running", ranks="0,1", step=9, loss=0.1)
    board.add_points(0, "loss", list(range(10)), [1 / (s + 1) for s in range(10)])
    board.add_points(0, RATE, list(range(10)), [50.0] * 10)
    board.add_points(0, "acc", [4, 9], [0.5, 0.75])  # another metric, at its own cadence
    clock.now += 1
    board.update()
    first = sent[-1]
    assert first["kind"] == "delta" and first["seq"] == 2
    assert first["metrics"]["loss"] == {
        "0": [list(range(10)), [pytest.approx(1 / (s + 1)) for s in range(10)]]
    }
    assert first["metrics"][RATE]["0"][1] == [50.0] * 10
    assert first["metrics"]["acc"] == {"0": [[4, 9], [0.5, 0.75]]}
    assert [r["trial"] for r in first["rows"]] == [0, 1, 2]
    assert board.widget.head["counts"] == {
        "queued": 2,
        "running": 1,
        "done": 0,
        "failed": 0,
        "stopped": 0,
    }
    n = len(sent)
    clock.now += 1
    board.update()  # nothing changed: nothing is sent
    assert sent[n:] == []
    board.add_points(1, "loss", [0], [2.0])
    board.set_trial(1, label="lr=0.1", state="running", ranks="2,3", step=0, loss=2.0, best=2.0)
    clock.now += 0.1
    board.update()  # too soon after the last: held back
    assert sent[n:] == []
    board.update(force=True)
    last = sent[-1]
    assert last["metrics"] == {"loss": {"1": [[0], [2.0]]}}
    assert [r["trial"] for r in last["rows"]] == [1]  # only the row that changed
    assert last["seq"] > first["seq"] and board.widget.head["best"] == 1
    board.add_points(1, "loss", [1, 2], [float("nan"), 1.5])  # NaN and None: no point
    board.add_points(1, RATE, [1, 2], [None, 40.0])
    board.update(force=True)
    assert sent[-1]["metrics"] == {"loss": {"1": [[2], [1.5]]}, RATE: {"1": [[2], [40.0]]}}


def test_a_late_view_starts_from_the_history(shown):
    board, clock, sent, _, _ = shown
    board.set_trial(0, label="a", state="running")
    board.add_points(0, "loss", [0, 1, 2], [3.0, 2.0, 1.0])
    clock.now += 6  # past the history's refresh period: the update refreshes it instead
    board.update()
    h = board.widget.history
    assert h["metrics"]["loss"] == {"0": [[0, 1, 2], [3.0, 2.0, 1.0], 2]}
    assert h["rows"] == board.rows
    assert sent == []
    clock.now += 1
    board.update()
    assert sent == []  # what the history holds is not sent again


def test_a_trial_of_100k_points_costs_a_bounded_amount(shown):
    board, clock, sent, _, _ = shown
    for t in range(4):
        board.set_trial(t, label=f"t{t}", state="running")
    for start in range(0, 100_000, 5000):  # the runner's batches, an update after each
        steps = list(range(start, start + 5000))
        for t in range(4):
            board.add_points(t, "loss", steps, [1 / math.sqrt(s + 1) + t for s in steps])
            board.add_points(t, RATE, steps, [10.0] * 5000)
        clock.now += 0.3
        board.update()
    assert all(len(board.curve("loss", t)[0]) <= 2000 for t in range(4))
    assert max(len(json.dumps(m)) for m in sent) < 60_000, "a message grew with the trial"
    assert sum(len(m["metrics"].get("loss", {}).get("0", [[]])[0]) for m in sent) < 10_000
    assert board.sent_bytes < 3_000_000  # 800k points in
    xs, ys = board.curve("loss", 0)
    assert xs == sorted(xs) and max(ys) == pytest.approx(1.0) and xs[-1] == 99_999
    board.finish("ok")
    assert len(json.dumps(board.widget.history)) < 200_000


def test_finish_adds_a_picture_and_keeps_the_widget(shown):
    board, _, _, handle, _ = shown
    board.set_trial(0, label="lr=$x$, width=32", state="done", step=9, loss=0.2, best=0.1)
    board.set_trial(1, label="lr=0.01", state="stopped", note="stopped: worse than the median")
    board.set_trial(2, label="lr=1", state="failed", note="RuntimeError: <b>boom</b> $x_1$")
    for t in range(3):
        board.add_points(t, "loss", list(range(10)), [1 / (s + 1 + t) for s in range(10)])
        board.add_points(t, RATE, list(range(10)), [5.0] * 10)
    board.finish("failed")
    (data,) = handle.updates
    assert base64.b64decode(data["image/png"])[:4] == b"\x89PNG"
    assert "application/vnd.jupyter.widget-view+json" in data
    assert board.widget.head["status"] == "failed"
    assert board.widget.history["rows"][2]["note"] == "RuntimeError: <b>boom</b> $x_1$"


def test_finish_without_a_widget_still_draws():
    board = SweepBoard("s")
    board.finish("interrupted")
    assert board.picture()[:4] == b"\x89PNG"


def test_metrics_past_the_limit_are_not_charted(shown):
    board, clock, sent, _, _ = shown
    for i in range(200):
        board.add_points(0, f"m{i}", [0], [1.0])
    board.update(force=True)
    assert len(sent[-1]["metrics"]) == MAX_METRICS - 1  # "loss" is one of the fifty
