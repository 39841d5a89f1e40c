"""One number everywhere, at 2 ranks and at 64 (issue 45): JupyterLab in Chromium runs a real
cluster's cells and the board is held against the run store.

- 2 ranks, 300 steps of loss, acc and lr: hovering the small acc and lr charts (decimated once
  the run ends: a history sends each rank fewer points than steps), every value the readout shows
  is the store's at the step it names, with smoothing 0 and 0.6 (then labelled smoothed, the raw
  value beside it, in the same number format); the head's loss is the mean at the step it names.
- A message the board cannot read is one line on it, mended when the kernel answers its request
  for the whole board (asked as it read the bad message, answered when that cell ends).
- A board whose drawing throws (the kernel sends a head its view cannot draw, to the end): one
  line at its top, and under it the finished board's picture once the cell ends.
- 64 light ranks (--oversubscribe): each chart is the mean, the band of the ranks' values and the
  outlier rank 40's own line, named, and its title says so; health a grid of 64 cells, the table
  behind a toggle.

Screenshots, light and dark: test-artifacts/screenshots/board-numbers-*.png, board-64-*.png,
board-throws-*.png.
"""

from __future__ import annotations

import json
import re

import pytest
from lab import SHOTS, chromium_page, need_chromium, notebook, serving

from nbdist.telemetry.store import RunStore

SMALL = """%%distributed --name numbers
import time
for s in range(300):
    r = nbdist.rank()
    nbdist.report(step=s, loss=(1 + r) / (s + 1), acc=((7 * s + 3 * r) % 16) / 16,
                  lr=1e-5 * (1 - s / 300) + r * 1e-7)
    time.sleep(0.005)
"""
BAD_MESSAGE = """import time
from nbdist.notebook.run.observers import dashboard as _boards
_d = _boards.last().dashboard
_d.seq += 1
_d.widget.send({"kind": "delta", "seq": _d.seq, "metrics": {"loss": {"mean": 5}}})
time.sleep(4)
"""
# A board whose drawing throws: the kernel sends a head the view cannot draw (its status a
# number), every time, to the end; the cell after puts the dashboard back as it was.
THROWS = """from nbdist.notebook.board import dashboard as _dash
_head = _dash.Dashboard._head
_dash.Dashboard._head = lambda self, *a: {**_head(self, *a), "status": 5}
"""
THROWING = """%%distributed --name throws
import time
for s in range(20):
    nbdist.report(step=s, loss=1 / (s + 1))
    time.sleep(0.02)
"""
MENDED = "_dash.Dashboard._head = _head"
MANY = """%%distributed --name many
import time
for s in range(40):
    r = nbdist.rank()
    nbdist.report(step=s, loss=1 / (s + 1) + 0.001 * r + (1.5 if r == 40 else 0.0), samples=4)
    time.sleep(0.1)
"""
CELLS = [
    "%load_ext nbdist\n%nbdist start -n 2",
    SMALL,
    BAD_MESSAGE,
    THROWS,
    THROWING,
    MENDED,
    "%nbdist stop\n%nbdist start -n 64 --oversubscribe",
    MANY,
    "%nbdist stop",
]
RUN_ALL = "() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }"
THEME = "t => window.jupyterapp.commands.execute('apputils:change-theme', {theme: t})"
NEXT_FRAME = "() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    need_chromium()
    base = tmp_path_factory.mktemp("numbers-lab")
    with serving(base, "numbers.ipynb", notebook(CELLS)) as (lab, root):
        yield lab, base / "data"


def _store(data) -> dict[str, dict[tuple[int, int], float]]:
    """The run store's values of the 2-rank run: metric -> (rank, step) -> value."""
    store = RunStore(data / "runs.sqlite")
    run = next(r for r in store.list_runs() if r["name"] == "numbers")
    out: dict[str, dict] = {"loss": {}, "acc": {}, "lr": {}}
    for row in store.metrics(run["id"]):
        out["loss"][row["rank"], row["step"]] = row["loss"]
        for name in ("acc", "lr"):
            out[name][row["rank"], row["step"]] = row["extra"][name]
    return out


def _hover(page, chart, fraction: float) -> tuple[int, list[dict], str]:
    """The mouse at ``fraction`` of the chart's width: the cursor's step, what the readout
    says of each line (its data), and its text."""
    box = chart.locator(".u-over").bounding_box()
    page.mouse.move(box["x"] + box["width"] * fraction, box["y"] + box["height"] / 2)
    page.evaluate(NEXT_FRAME)
    step = int(float(chart.get_attribute("data-readout-step")))
    text = chart.locator(".nbdist-chart-readout").inner_text()
    return step, json.loads(chart.get_attribute("data-readout")), text


def _smoothing(board, weight: float) -> None:
    """Move the board's smoothing slider to ``weight``."""
    board.locator(".nbd-smooth input").evaluate(
        "(el, w) => { el.value = String(w); el.dispatchEvent(new Event('input')); }", weight
    )


def _agrees(readings: list[dict], values: dict, smoothed: bool) -> None:
    """Every reading is the store's value at the step it names (the mean: the ranks' mean),
    drawn as it is when not smoothed."""
    for r in readings:
        step = r["x"]
        if r["label"] == "mean":
            want = sum(values[k, step] for k in (0, 1)) / 2
        else:
            want = values[int(r["label"].split()[1]), step]
        assert r["raw"] == pytest.approx(want, rel=1e-9), (r, want)
        if not smoothed:
            assert r["y"] == r["raw"]


@pytest.mark.timeout(600)
def test_the_board_agrees_with_the_store_at_2_and_64_ranks(lab):
    from playwright.sync_api import expect

    server, data = lab
    SHOTS.mkdir(parents=True, exist_ok=True)
    with chromium_page(server, "lab/tree/numbers.ipynb", height=1100, ready=".jp-Notebook") as page:
        page.wait_for_function(
            "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
            " return w && w.sessionContext && w.sessionContext.session"
            " && w.sessionContext.session.kernel; }"
        )
        page.evaluate(RUN_ALL)
        small = page.locator(".nbd-dashboard").first
        small.wait_for(timeout=120_000)
        # the message it cannot read: one line on the board, then mended by the kernel's answer
        page.wait_for_function(
            "() => /could not read the kernel's message/.test("
            "document.querySelector('.nbd-dashboard').dataset.problem || '')",
            timeout=120_000,
        )
        assert small.locator(".nbdist-board-problem").is_visible()
        page.wait_for_function(
            "() => document.querySelector('.nbd-dashboard').dataset.problem === ''",
            timeout=60_000,
        )
        expect(small).to_have_attribute("data-status", "ok")

        # a board whose drawing throws: one line, and the finished board's picture under it
        throws = page.locator(".nbd-dashboard").nth(1)
        throws.wait_for(timeout=120_000)
        page.wait_for_function(
            "() => /^this board could not draw: .*split.* \\(the finished board below\\)$/"
            ".test(document.querySelectorAll('.nbd-dashboard')[1].dataset.problem || '')",
            timeout=120_000,
        )
        line = throws.locator(".nbdist-board-problem")
        assert line.is_visible() and "\n" not in line.inner_text()
        picture = throws.locator("img.nbdist-board-picture")
        expect(picture).to_be_visible()
        assert picture.evaluate("img => img.complete && img.naturalWidth") == 760
        assert picture.get_attribute("src").startswith("data:image/svg+xml")

        many = page.locator(".nbd-dashboard").nth(2)
        many.wait_for(timeout=300_000)
        expect(many).to_have_attribute("data-status", "ok", timeout=300_000)
        page.get_by_text("nbdist: cluster stopped").nth(1).wait_for(timeout=120_000)

        # -- 2 ranks: the readout against the store ---------------------------------------
        values = _store(data)
        small.scroll_into_view_if_needed()
        _smoothing(small, 0)  # the board starts at 0.6
        head = small.locator(".nbd-stats").inner_text()
        m = re.search(r"mean loss (\S+) at step (\d+)", head)
        assert m and int(m[2]) == 299, head
        assert float(m[1]) == pytest.approx((1 / 300 + 2 / 300) / 2, rel=1e-3)
        elsewhere = 0
        for name in ("acc", "lr", "loss"):
            chart = small.locator(f".nbdist-chart[data-metric='{name}']")
            chart.scroll_into_view_if_needed()
            for fraction in (0.02, 0.31, 0.5, 0.73, 0.9, 0.999):
                step, readings, text = _hover(page, chart, fraction)
                assert [r["label"] for r in readings] == ["rank 0", "rank 1", "mean"], text
                _agrees(readings, values[name], smoothed=False)
                elsewhere += sum(r["x"] != step for r in readings)
                assert "smoothed" not in text and text.startswith(f"step {step:,}")
        assert elsewhere, "no decimated line was read: the test does not test what it says"
        # one number format for lr, whatever the smoothing: the exponent form
        lr = small.locator(".nbdist-chart[data-metric='lr']")
        lr.scroll_into_view_if_needed()
        plain = _hover(page, lr, 0.5)[2]
        _smoothing(small, 0.6)
        for name in ("acc", "lr"):
            chart = small.locator(f".nbdist-chart[data-metric='{name}']")
            step, readings, text = _hover(page, chart, 0.5)
            _agrees(readings, values[name], smoothed=True)
            assert "smoothed (raw)" in text
            assert any(r["y"] != r["raw"] for r in readings)
        smooth = _hover(page, lr, 0.5)[2]
        for shown in (plain, smooth):
            numbers = re.findall(r"(?:rank \d|mean) (\S+)", shown)
            assert numbers and all("e-" in n for n in numbers), shown
        small.screenshot(path=str(SHOTS / "board-numbers-smoothed-light.png"))
        throws.scroll_into_view_if_needed()
        throws.screenshot(path=str(SHOTS / "board-throws-light.png"))

        # -- 64 ranks: the band, the outlier, the health grid ------------------------------
        many.scroll_into_view_if_needed()
        loss = many.locator(".nbdist-chart[data-metric='loss']")
        expect(loss).to_have_attribute("data-outliers", "40")
        # the title says what is drawn, not "per rank"
        title = "loss: mean, min–max band of 64 ranks, outliers 40"
        expect(loss.locator(".nbdist-chart-title")).to_have_text(title)
        step, readings, text = _hover(page, loss, 0.6)
        assert [r["label"] for r in readings] == ["max", "min", "mean", "rank 40"], text
        by = {r["label"]: r for r in readings}
        assert by["max"]["raw"] == pytest.approx(by["rank 40"]["raw"])  # the outlier is the max
        assert by["min"]["raw"] < by["mean"]["raw"] < by["max"]["raw"]
        assert by["min"]["raw"] == pytest.approx(1 / (by["min"]["x"] + 1), rel=1e-9)
        grid = many.locator(".nbd-health")
        expect(grid).to_have_attribute("data-cells", "64")
        expect(grid.locator(".nbd-cell.nbd-state-done")).to_have_count(64)
        assert grid.locator(".nbd-cell").first.get_attribute("title").startswith("rank 0 · done")
        table = many.locator(".nbd-table-box")
        expect(table).to_be_hidden()
        page.mouse.move(0, 0)
        many.screenshot(path=str(SHOTS / "board-64-light.png"))
        grid.locator(".nbd-health-toggle").click()
        expect(table).to_be_visible()
        expect(table.locator("tbody tr")).to_have_count(64)
        grid.locator(".nbd-health-toggle").click()
        page.evaluate(THEME, "JupyterLab Dark")
        page.wait_for_selector(".nbd-dashboard[data-theme='false']", state="attached")
        page.wait_for_selector("#jupyterlab-splash", state="detached")
        many.scroll_into_view_if_needed()
        _hover(page, loss, 0.6)
        many.screenshot(path=str(SHOTS / "board-64-dark.png"))
        throws.scroll_into_view_if_needed()
        throws.screenshot(path=str(SHOTS / "board-throws-dark.png"))
        small.scroll_into_view_if_needed()
        acc = small.locator(".nbdist-chart[data-metric='acc']")
        _hover(page, acc, 0.5)
        small.screenshot(path=str(SHOTS / "board-numbers-smoothed-dark.png"))
