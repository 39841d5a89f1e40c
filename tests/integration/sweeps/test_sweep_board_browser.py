"""The sweep board in a real JupyterLab and Chromium: a notebook's kernel drives a ``SweepBoard``
as the sweep runner will (four trials: two done, one stopped early, one failed), and the page
shows its curves and its trials table, updating while the cell runs; screenshots go to
test-artifacts/screenshots/sweep-board-*.png."""

from __future__ import annotations

import base64
import json

import pytest
from lab import CHROMIUM, SHOTS, need_chromium, notebook, serving
from paths import ARTIFACTS

WIDGET = "application/vnd.jupyter.widget-view+json"
LABELS = ["lr=0.1, width=32", "lr=0.1, width=64", "lr=0.01, width=32", "lr=0.01, width=64"]
ERROR = "RuntimeError: CUDA out of memory <b>not bold</b>"

SHOW = f"""from nbdist.notebook.sweeps.board import RATE, SweepBoard
board = SweepBoard("sweep <i>lr × width</i>")
board.show()
labels = {LABELS!r}
for t, label in enumerate(labels):
    board.set_trial(t, label=label, state="queued")
board.update(force=True)
"""

# Two slots (ranks 0 and 1): trials 0 and 1 start; 1 is stopped by the median rule at step 40 and
# 2 takes its slot; 0 is done at step 100 and 3 takes its slot, then fails at step 25; 2 is done.
# Halfway (trial 0 at step 59) it waits for the file "resume", which the test writes.
FEED = f"""import math, os, random, time
rng = random.Random(0)
plan = {{0: (0, "0", 100), 1: (0, "1", 40), 2: (40, "1", 100), 3: (100, "0", 25)}}
ends = {{0: ("done", ""), 1: ("stopped", "stopped: worse than the median at step 40"),
        2: ("done", ""), 3: ("failed", {ERROR!r})}}
best = {{}}
for tick in range(146):
    if tick == 60:  # the test looks at the board as it is now, then lets the sweep go on
        board.update(force=True)
        deadline = time.monotonic() + 60
        while not os.path.exists("resume") and time.monotonic() < deadline:
            time.sleep(0.05)
    for t, (start, ranks, steps) in plan.items():
        step = tick - start
        if not 0 <= step <= steps:
            continue
        loss = (1 + 0.4 * t) * math.exp(-step / (25 + 15 * t)) + 0.1 * t + 0.05 + rng.gauss(0, 0.01)
        rate = 900 + 150 * t + rng.gauss(0, 20)
        best[t] = min(best.get(t, loss), loss)
        board.add_points(t, "loss", [step], [loss])
        board.add_points(t, RATE, [step], [rate])
        if step % 10 == 0:  # another metric, at a cadence of its own
            board.add_points(t, "val_acc", [step], [1 - loss / 3])
        state, note = ends[t] if step == steps else ("running", "")
        board.set_trial(t, label=labels[t], state=state, ranks=ranks, step=step, loss=loss,
                        best=best[t], samples_per_s=rate, note=note)
    board.update()
    time.sleep(0.02)  # a training step
board.finish("ok")
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A real ``jupyter lab`` serving a notebook: a cell shows the board, the next feeds it."""
    need_chromium()
    base = tmp_path_factory.mktemp("sweep-lab")
    with serving(base, "sweep.ipynb", notebook([SHOW, FEED])) as (lab, root):
        yield lab, root


def _states(board) -> list[str]:
    return board.locator("tbody .nbs-state").all_inner_texts()


@pytest.mark.timeout(150)
def test_sweep_board_in_a_real_browser(lab):
    from playwright.sync_api import expect, sync_playwright

    lab, root = lab
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--no-first-run"],
        )
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.set_default_timeout(60_000)
            page.goto(lab.page_url("lab/tree/sweep.ipynb"))
            page.wait_for_selector(".jp-Notebook .jp-Cell")
            page.wait_for_function(
                "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
                " return w && w.sessionContext && w.sessionContext.session"
                " && w.sessionContext.session.kernel; }"
            )
            run_next = (
                "() => { window.jupyterapp.commands.execute('notebook:run-cell-and-select-next'); }"
            )
            page.evaluate(run_next)  # the first cell: the board, four trials queued
            board = page.locator(".nbs-board").first
            board.wait_for()
            page.wait_for_selector(".nbs-board[data-trials='4']")
            assert _states(board) == ["queued"] * 4
            assert board.get_attribute("data-curves") == "0"

            page.evaluate(run_next)  # the second: the sweep runs for about three seconds
            # halfway, the sweep waits: every point so far has arrived, once
            expect(board.locator("tbody tr[data-trial='0'] .nbs-col-step")).to_have_text("59")
            assert board.get_attribute("data-status") == "running"
            assert _states(board) == ["running", "stopped", "running", "queued"]
            assert board.get_attribute("data-points") == str(60 + 41 + 20)
            assert board.get_attribute("data-curves") == "3"
            board.scroll_into_view_if_needed()
            board.screenshot(path=str(SHOTS / "sweep-board-live-light.png"))
            (root / "resume").touch()
            page.wait_for_function(  # the curves gain points while the cell runs
                "() => +document.querySelector('.nbs-board').dataset.points > 121 + 20"
            )

            page.wait_for_selector(".nbs-board[data-status='ok']", timeout=60_000)
            # the cell ends: the output gains the picture, and the lab draws the widget anew
            page.wait_for_function(
                "() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
                ".status === 'idle'"
            )
            page.wait_for_selector(".nbs-board[data-status='ok']")
            # the rows' last states may come in the message after the status's
            expect(board.locator("tbody .nbs-state")).to_have_text(
                ["done", "stopped", "done", "failed"]
            )
            values = board.locator("tbody .nbs-col-label").all_inner_texts()
            assert values == LABELS
            steps = board.locator("tbody .nbs-col-step").all_inner_texts()
            assert steps == ["100", "40", "100", "25"]
            # text from the kernel stays text: no element is made of it
            assert board.locator(".nbs-title").inner_text() == "sweep <i>lr × width</i>"
            assert board.locator("tbody tr").nth(3).locator(".nbs-col-note").inner_text() == ERROR
            assert board.locator("b, i").count() == 0
            # a chart per metric, one curve per trial on each: loss, samples/s, then val_acc
            charts = board.locator(".nbdist-chart")
            expect(charts).to_have_count(3)
            assert charts.nth(2).get_attribute("data-metric") == "val_acc"
            for i in range(3):
                expect(charts.nth(i)).to_have_attribute("data-lines", "4")
            # the best trial (lowest best loss: trial 0) is marked, in the table and the header
            assert board.get_attribute("data-best") == "0"
            leader = board.locator("tbody tr.nbs-leader")
            assert leader.count() == 1 and leader.get_attribute("data-trial") == "0"
            assert "best: #0 lr=0.1, width=32" in board.locator(".nbs-best-line").inner_text()
            assert [c.strip() for c in board.locator(".nbs-counts").inner_text().split("\n")] == [
                "2 done",
                "1 failed",
                "1 stopped",
            ]
            board.screenshot(path=str(SHOTS / "sweep-board-final-light.png"))
            loss = charts.first
            linear = loss.evaluate("el => el.querySelector('canvas').toDataURL()")
            loss.locator(".nbdist-chart-log").click()  # a log axis: the same curves, redrawn
            expect(loss).to_have_attribute("data-log", "true")
            assert loss.evaluate("el => el.querySelector('canvas').toDataURL()") != linear
            expect(loss).to_have_attribute("data-lines", "4")
            page.evaluate(
                "window.jupyterapp.commands.execute('apputils:change-theme',"
                " {theme: 'JupyterLab Dark'})"
            )
            page.wait_for_selector(".nbs-board[data-theme='false']", state="attached")
            page.wait_for_function(  # the theme's stylesheet applied: a dark background
                "() => getComputedStyle(document.querySelector('.nbs-board')).backgroundColor"
                " !== 'rgb(255, 255, 255)'"
            )
            board.screenshot(path=str(SHOTS / "sweep-board-final-dark.png"))
            # a row under the pointer: its curve stands out on every chart
            board.locator("tbody tr").nth(2).hover()
            for i in range(3):
                expect(charts.nth(i)).to_have_attribute("data-focus", f"#2 {LABELS[2]}")
            board.screenshot(path=str(SHOTS / "sweep-board-hover-dark.png"))
            page.evaluate("window.jupyterapp.commands.execute('docmanager:save')")
            page.wait_for_function(
                "() => !window.jupyterapp.shell.currentWidget.context.model.dirty"
            )
        finally:
            browser.close()
    # the saved notebook keeps the widget and a picture of the board, for renderers without one
    outputs = json.loads((root / "sweep.ipynb").read_text())["cells"][0]["outputs"]
    boards = [o for o in outputs if WIDGET in o.get("data", {})]
    assert len(boards) == 1
    png = base64.b64decode(boards[0]["data"]["image/png"])
    assert png[:4] == b"\x89PNG"
    (ARTIFACTS / "sweep-board-static.png").write_bytes(png)
