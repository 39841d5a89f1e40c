"""The boards in Jupyter Notebook 7, as in JupyterLab: a real Notebook 7 server (``/tree``,
``/notebooks/...``) in Chromium runs a ``%%distributed`` cell that reports and a small sweep on a
local 2-engine cluster; the live dashboard and the sweep board are drawn and updated while their
cells run (their DOM, as the JupyterLab tests read it), their front ends acknowledge them to the
kernel, and the saved notebook keeps their pictures. Screenshots, light theme, for the docs:
test-artifacts/screenshots/notebook7-*.png. (Headless runs: test_front_ends.py.)"""

from __future__ import annotations

import json

import pytest
from lab import need_chromium, notebook, serving

WIDGET = "application/vnd.jupyter.widget-view+json"
TRAIN = """%%distributed --total 100 --name nb7
import math, time
for i in range(100):
    loss = (1 + 0.3 * nbdist.rank()) * math.exp(-i / 30) + 0.05
    nbdist.report(step=i, loss=loss, samples=32, acc=1 - math.exp(-i / 40))
    time.sleep(0.05)
"""
SWEEP = """%%distributed --sweep lr=0.1,0.3 --trial-size 1 --name nb7-sweep
import time
for step in range(30):
    nbdist.report(step=step, loss=lr / (step + 1) + 0.01, samples=8)
    time.sleep(0.05)
"""
# run after the boards' cells have ended: by then the kernel has read their acknowledgements
SEEN = """from nbdist.notebook.run.observers import dashboard as boards
from nbdist.notebook.sweeps import board
print("SEEN", dash.seen, dash.live, board.last().seen, board.last().live)
"""
CELLS = [
    "%load_ext nbdist\n%nbdist start -n 2",
    TRAIN,
    "from nbdist.notebook.run.observers import dashboard as boards\ndash = boards.last().dashboard",
    SWEEP,
    SEEN,
    "%nbdist stop",
]
#: Whether the cell at an index has run to its end (Notebook 7 numbers it then, as JupyterLab).
DONE = """i => { const p = document.querySelectorAll('.jp-Notebook .jp-Cell')[i]
  .querySelector('.jp-InputPrompt'); return p && /\\[\\d+\\]/.test(p.textContent); }"""


@pytest.fixture(scope="module")
def notebook7(tmp_path_factory):
    """A real Jupyter Notebook 7 server serving the notebook; its kernel keeps records apart."""
    need_chromium()
    pytest.importorskip("notebook")
    base = tmp_path_factory.mktemp("nb7")
    with serving(base, "nb7.ipynb", notebook(CELLS), app="notebook") as (server, root):
        yield server, root


def _run(page, index: int) -> None:
    """Select cell ``index`` and run it (not awaited: the page goes on while it runs)."""
    page.evaluate(
        "i => { const app = window.jupyterapp, nb = app.shell.currentWidget.content;"
        " nb.activeCellIndex = i; app.commands.execute('notebook:run-cell'); }",
        index,
    )


@pytest.mark.timeout(300)
def test_boards_in_notebook_7(notebook7):
    from lab import ARTIFACTS, chromium_page
    from playwright.sync_api import expect

    server, root = notebook7
    shots = ARTIFACTS / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    # Notebook 7's file browser at /tree lists the notebook; it opens at /notebooks/nb7.ipynb
    with chromium_page(server, "tree", height=1000, ready=".jp-DirListing-item") as page:
        expect(page.locator(".jp-DirListing-itemName", has_text="nb7.ipynb")).to_be_visible()
        page.goto(server.page_url("notebooks/nb7.ipynb"))
        page.wait_for_selector(".jp-Notebook")
        assert page.locator("#jp-main-dock-panel").count() == 0  # Notebook 7, not JupyterLab
        left = page.evaluate("() => [...window.jupyterapp.shell.widgets('left')].map(w => w.id)")
        assert "nbdist-sidebar" in left  # the sidebar is in Notebook 7's left panel too
        page.wait_for_function(
            "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
            " return w && w.sessionContext && w.sessionContext.session"
            " && w.sessionContext.session.kernel; }"
        )
        _run(page, 0)
        page.wait_for_function(DONE, arg=0, timeout=120_000)
        _run(page, 1)  # the training cell: its dashboard, live
        board = page.locator(".nbd-dashboard").first
        board.wait_for()
        page.wait_for_function(
            "() => { const b = document.querySelector('.nbd-dashboard');"
            " return b && +b.dataset.points >= 20 && b.dataset.ranks === '2'; }"
        )
        assert board.get_attribute("data-status") == "running"
        first = int(board.get_attribute("data-points"))
        page.wait_for_function(  # the chart gains points while the cell runs
            "n => +document.querySelector('.nbd-dashboard').dataset.points > n + 20", arg=first
        )
        charts = board.locator(".nbdist-chart[data-metric]")
        expect(charts).to_have_count(2)
        assert [charts.nth(i).get_attribute("data-metric") for i in range(2)] == ["loss", "acc"]
        assert board.locator("tbody tr").count() == 2
        page.wait_for_selector(".nbd-dashboard[data-status='ok']", timeout=120_000)
        page.wait_for_function(DONE, arg=1)  # its output redrawn with the picture
        assert "100 / 100 steps" in board.inner_text()
        expect(board.locator("tbody .nbd-state")).to_have_text(["done", "done"])
        assert board.get_attribute("data-theme") == "true"  # the light theme
        board.scroll_into_view_if_needed()
        board.screenshot(path=str(shots / "notebook7-dashboard.png"))

        _run(page, 2)
        page.wait_for_function(DONE, arg=2)
        _run(page, 3)  # the sweep: its board, live
        sweep = page.locator(".nbs-board").first
        sweep.wait_for()
        page.wait_for_selector(".nbs-board[data-trials='2']")
        page.wait_for_function(  # points arrive while the trials run
            "() => { const b = document.querySelector('.nbs-board');"
            " return b.dataset.status === 'running' && +b.dataset.points > 10; }"
        )
        page.wait_for_selector(".nbs-board[data-status='ok']", timeout=120_000)
        # the cell's end redraws its output (the widget and now its picture): wait for that view
        page.wait_for_function(DONE, arg=3)
        expect(sweep.locator("tbody .nbs-state")).to_have_text(["done", "done"])
        sweep.scroll_into_view_if_needed()  # a chart out of view waits to be drawn
        expect(sweep.locator(".nbdist-chart").first).to_have_attribute("data-lines", "2")
        sweep.screenshot(path=str(shots / "notebook7-sweep-board.png"))

        _run(page, 4)  # the kernel heard from both boards' front ends
        page.wait_for_function(DONE, arg=4)
        seen = page.locator(".jp-Notebook .jp-Cell").nth(4).locator(".jp-OutputArea-output")
        expect(seen).to_have_text("SEEN True True True True")
        _run(page, 5)
        page.wait_for_function(DONE, arg=5, timeout=120_000)
        page.evaluate("window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty")
    # the saved notebook keeps each live widget and a picture of it
    cells = json.loads((root / "nb7.ipynb").read_text())["cells"]
    for index, mime in ((1, "image/svg+xml"), (3, "image/png")):
        shown = [o for o in cells[index]["outputs"] if WIDGET in o.get("data", {})]
        assert len(shown) == 1 and mime in shown[0]["data"], cells[index]["outputs"]
    assert not [o for c in cells for o in c["outputs"] if o["output_type"] == "error"]
