"""The sidebar's runs in a real JupyterLab, driven through Chromium: a run without reports, a live
run opened from its card, the card of a failed run, a past run opened, two runs compared.

A real kernel starts a real cluster (``%nbdist start -n 2``) and runs real ``%%distributed``
cells: one that reports nothing; one that reports loss (falling over six decades), acc at every
step and val_loss every tenth; and a like one (its loss falling over four decades) whose rank 1
raises ``KeyError: 'b'`` at its end (rank 0 waits, and is stopped by the failure). The panel must
say what happened: a run without reports says so; a live run's view follows it to its end, then
stops asking; the failed run's card names the failing rank and its error and no tile of it says
"ok" (not even once the cluster is stopped); clicking a past run opens one chart per metric
(each rank and their mean, log axis, hover readout); two runs ticked and compared are overlaid on
the metric picked. Screenshots, light and dark, go to test-artifacts/screenshots/sidebar-*.png.

Needs /usr/bin/chromium (``scripts/install-system-deps.sh`` installs it).
"""

from __future__ import annotations

import re
import time

import pytest
from kernels import shutdown_kernel, start_kernel
from lab import chromium_page
from processes import wait_until

# the browser, its flags and the screenshots are the sidebar test's (the lab, its data folder
# and the shadows of pytest-jupyter's autouse fixtures: conftest.py)
from test_sidebar_browser import (  # noqa: F401
    opened_compare,
    pytestmark,
    set_theme,
    shot,
    sidebar,
)

STEPS = 300
CELL = """\
%%distributed --name {name} --timeout 120
import time
for step in range({steps}):
    loss = 2.3 * 10 ** (-{decades} * step / {steps})
    extra = {{"acc": min(1.0, step / {steps} + 0.05 * nbdist.rank())}}
    if step % 10 == 0:
        extra["val_loss"] = 1.5 * 10 ** (-{decades} / 2 * step / {steps})
    nbdist.report(step=step, loss=loss, samples=32, **extra)
    time.sleep({pause})
{tail}
"""
FAIL = """\
if nbdist.rank() == 1:
    {}['b']
time.sleep(60)  # rank 0 waits: the failure stops it
"""


@pytest.fixture(scope="module")
def page(lab):
    with chromium_page(lab, width=1400, height=900) as pg:
        pg.click('li[data-id="nbdist-sidebar"]')
        sidebar(pg).get_by_text("Clusters").first.wait_for()
        yield pg


@pytest.fixture(scope="module")
def kernel(data, lab):
    """A kernel with a 2-engine cluster of its own; stopped and shut down (checked) after."""
    k = start_kernel()
    try:
        k.ok("%nbdist start -n 2", timeout=180)
        yield k
    finally:
        k.run("%nbdist stop")
        shutdown_kernel(k)


@pytest.fixture(scope="module")
def runs() -> dict[str, int]:
    """The runs the tests made, by name: each test adds its own, later ones read them."""
    return {}


def _latest_run_id(kernel) -> int:
    out = kernel.ok("import nbdist; print('RUN', nbdist.runs()[0].id)").stdout
    return int(re.search(r"RUN (\d+)", out).group(1))


def card(page, run_id: int):
    return sidebar(page).locator(f'.jp-nbdist-run[data-run-id="{run_id}"]')


def test_a_finished_run_without_reports_says_so(page, kernel, runs):
    res = kernel.ok("%%distributed --name quiet\nx = 1")
    assert res.error is None
    quiet = runs["quiet"] = _latest_run_id(kernel)
    page.wait_for_selector(f'.jp-nbdist-run[data-run-id="{quiet}"][data-status="ok"]')
    c = card(page, quiet)
    empty = c.get_by_test_id("nbdist-curve-empty")
    empty.wait_for()
    wait_until(lambda: "no reports" in empty.inner_text(), 30, what="'no reports' on the card")
    assert "waiting" not in c.inner_text()


# When the page asked for a run's curves (epoch seconds), with how many points, from the
# browser's resource timing: the run view asks for 1000, the sidebar's card for 200.
CURVE_READS = """([run, points]) => performance.getEntriesByType('resource')
  .filter(e => e.name.includes(`/nbdist/api/runs/${run}/curves?points=${points}`))
  .map(e => (performance.timeOrigin + e.startTime) / 1000)"""
HEALTH_READS = """() => performance.getEntriesByType('resource')
  .filter(e => e.name.split('?')[0].endsWith('/health'))
  .map(e => (performance.timeOrigin + e.startTime) / 1000)"""


CLOSE = """id => { for (const w of window.jupyterapp.shell.widgets('main'))
  if (w.id === id) w.close(); }"""


def _reads_after(page, script: str, arg, since: float) -> int:
    return len([t for t in page.evaluate(script, arg) if t > since])


def test_a_live_run_opened_from_its_card_keeps_updating_until_it_ends(page, kernel, runs):
    page.evaluate("performance.setResourceTimingBufferSize(1e5)")
    sent = kernel.submit(CELL.format(name="good", steps=STEPS, decades=6, pause=0.03, tail=""))
    live = sidebar(page).locator('.jp-nbdist-run[data-status="running"]')
    live.wait_for(timeout=60_000)
    run_id = int(live.get_attribute("data-run-id"))
    runs["good"] = run_id
    live.get_by_role("button", name="Open run").click()
    view = page.locator(f"#nbdist-run-{run_id}")
    loss = view.locator('.jp-nbdist-chartBox[data-metric="loss"] .nbdist-chart')
    loss.wait_for()

    def step() -> int:
        return int(float(loss.get_attribute("data-readout-step") or -1))

    wait_until(lambda: step() >= 0, 30, interval=0.1, what="a first step in the run's view")
    first = step()
    wait_until(lambda: step() >= first + 20, 30, interval=0.1, what="the view to follow the run")
    # closed, the view asks no more, though its run goes on
    page.evaluate(CLOSE, f"nbdist-run-{run_id}")
    view.wait_for(state="detached")
    closed = time.time() + 0.5  # (a read on its way when it closed may still land)
    wait_until(
        lambda: _reads_after(page, HEALTH_READS, None, closed) >= 3,
        30,
        what="three more polls of the sidebar",
    )
    assert _reads_after(page, CURVE_READS, [run_id, 1000], closed) == 0
    assert live.count() == 1, "the run ended before the check: make it longer"
    # opened again, it follows the run to its end
    card(page, run_id).get_by_role("button", name="Open run").click()
    loss.wait_for()
    res = kernel.collect(sent, timeout=120)
    assert res.error is None, res.error
    status = view.get_by_test_id("nbdist-view-status")
    wait_until(lambda: status.inner_text() == "ok", 30, what="the view to see the run end")
    wait_until(lambda: step() == STEPS - 1, 30, what="the view's last step")
    assert view.locator(".jp-nbdist-fact").first.inner_text().split()[-1] == f"{STEPS}"
    # read to its end, the ended run's view asks no more (while the sidebar goes on polling)
    wait_until(  # the read that saw it end may still be on its way
        lambda: _reads_after(page, CURVE_READS, [run_id, 1000], time.time() - 1.5) == 0,
        30,
        what="the view to stop polling its ended run",
    )
    quiet_from = time.time()
    wait_until(
        lambda: _reads_after(page, HEALTH_READS, None, quiet_from) >= 3,
        30,
        what="three more polls of the sidebar",
    )
    assert _reads_after(page, CURVE_READS, [run_id, 1000], quiet_from) == 0


def test_a_failed_runs_card_names_the_rank_and_the_error(page, kernel, runs):
    bad = kernel.run(
        CELL.format(name="bad", steps=STEPS, decades=4, pause=0, tail=FAIL), timeout=150
    )
    assert bad.error is not None and "KeyError" in bad.error["evalue"], bad.error
    runs["bad"] = _latest_run_id(kernel)
    c = card(page, runs["bad"])
    c.wait_for()
    page.wait_for_selector(f'.jp-nbdist-run[data-run-id="{runs["bad"]}"][data-status="failed"]')
    error = c.get_by_test_id("nbdist-run-error")
    assert error.inner_text() == "rank 1: KeyError: 'b'"
    tiles = c.locator(".jp-nbdist-worker")
    wait_until(
        lambda: (
            tiles.count() == 2
            and tiles.nth(1).get_attribute("data-state") == "failed"
            and tiles.nth(0).get_attribute("data-state") in ("stopped", "done")
        ),
        30,
        what="rank 1 failed and rank 0 stopped on the card",
    )
    assert "ok" not in [tiles.nth(i).inner_text().lower().split()[-1] for i in range(2)]
    # the curve is the whole run's mean: four decades, so a log axis; both ends labelled
    curve = c.locator(".jp-nbdist-curve")
    wait_until(lambda: curve.get_attribute("data-log") == "true", 30, what="the card's curve")
    assert c.get_by_test_id("nbdist-curve-first").inner_text() == "step 0: 2.3"
    last = c.get_by_test_id("nbdist-curve-last").inner_text()
    assert last.startswith(f"step {STEPS - 1}: ") and "e-" in last
    assert c.get_by_test_id("nbdist-step").inner_text() == f"{STEPS}"
    shot(page, "failed-run", dark_too=True)

    # the cluster stopped: the run's tiles keep their final states, none live
    kernel.ok("%nbdist stop")
    sidebar(page).get_by_text("No cluster yet").wait_for(timeout=30_000)
    states = [tiles.nth(i).get_attribute("data-state") for i in range(tiles.count())]
    assert states[1] == "failed" and states[0] in ("stopped", "done"), states
    shot(page, "stopped-cluster")


def _chart_is_sharp(chart) -> bool:
    """The chart's canvas is its displayed size x devicePixelRatio."""
    return chart.evaluate(
        """el => { const c = el.querySelector('canvas'); if (!c) return false;
        const r = c.getBoundingClientRect(), d = window.devicePixelRatio;
        return r.width > 50 && Math.abs(c.width - Math.round(r.width * d)) <= 1
            && Math.abs(c.height - Math.round(r.height * d)) <= 1; }"""
    )


def test_clicking_a_past_run_opens_its_detail(page, runs):
    row = sidebar(page).locator(f'.jp-nbdist-pastRun[data-run-id="{runs["good"]}"]')
    row.locator(".jp-nbdist-runOpen").click()
    view = page.locator(f"#nbdist-run-{runs['good']}")
    view.wait_for()
    boxes = view.locator(".jp-nbdist-chartGrid").first.locator(".jp-nbdist-chartBox")
    wait_until(lambda: boxes.count() == 3, 30, what="a chart per metric")
    assert [boxes.nth(i).get_attribute("data-metric") for i in range(3)] == [
        "loss",
        "acc",
        "val_loss",
    ]
    for i in range(3):  # each rank and their mean
        chart = boxes.nth(i).locator(".nbdist-chart")
        page.wait_for_function("el => el.dataset.lines === '3'", arg=chart.element_handle())
        wait_until(lambda c=chart: _chart_is_sharp(c), 10, what="a sharp canvas")
    loss = boxes.nth(0).locator(".nbdist-chart")
    assert loss.get_attribute("data-log") == "true"  # six decades: log from the start
    plot = loss.locator(".u-over")
    plot.hover(position={"x": 100, "y": 40})
    readout = loss.locator(".nbdist-chart-readout")
    wait_until(lambda: not readout.inner_text().startswith("latest"), 10, what="the readout")
    assert re.match(r"step [\d,]+ · rank 0 .+ · rank 1 .+ · mean .+", readout.inner_text())
    acc = boxes.nth(1).locator(".nbdist-chart")
    assert acc.get_attribute("data-log") == "false"
    acc.locator(".nbdist-chart-log").click()
    page.wait_for_function("el => el.dataset.log === 'true'", arg=acc.element_handle())
    facts = view.locator(".jp-nbdist-facts").inner_text()
    assert f"{STEPS}" in facts and "ok" in view.get_by_test_id("nbdist-view-status").inner_text()
    page.mouse.move(5, 5)
    shot(page, "run-detail", dark_too=True)
    row.locator(".jp-nbdist-runOpen").click()  # opened again: the same view, to the front
    assert page.locator(f"#nbdist-run-{runs['good']}").count() == 1

    # the failed run, from its card: the error, its events, its failures in full
    card(page, runs["bad"]).get_by_role("button", name="Open run").click()
    bad = page.locator(f"#nbdist-run-{runs['bad']}")
    bad.wait_for()
    assert bad.get_by_test_id("nbdist-view-error").inner_text() == "rank 1: KeyError: 'b'"
    bad.locator('.jp-nbdist-events tr[data-kind="failed"]').first.wait_for()
    assert "KeyError" in bad.locator(".jp-nbdist-failure").first.inner_text()
    bad.locator('.jp-nbdist-worker[data-rank="1"][data-state="failed"]').wait_for()
    shot(page, "run-failed-detail", dark_too=True)
    bad.locator(".jp-nbdist-failure").first.scroll_into_view_if_needed()
    shot(page, "run-failed-events", dark_too=True)


def test_two_runs_ticked_and_compared(page, runs):
    panel = sidebar(page)
    card(page, runs["bad"]).locator(".jp-nbdist-select").check()
    panel.locator(f'.jp-nbdist-pastRun[data-run-id="{runs["good"]}"] .jp-nbdist-select').check()
    # a ctrl-click ticks a run too, and again unticks it
    quiet = panel.locator(f'.jp-nbdist-pastRun[data-run-id="{runs["quiet"]}"]')
    quiet.locator(".jp-nbdist-runOpen").click(modifiers=["Control"])
    panel.get_by_text("3 runs selected").wait_for()
    assert quiet.get_attribute("data-selected") == "true"
    quiet.locator(".jp-nbdist-runOpen").click(modifiers=["Control"])
    panel.get_by_text("2 runs selected").wait_for()
    assert page.locator("#nbdist-run-" + str(runs["quiet"])).count() == 0  # not opened
    view = opened_compare(page, panel, (runs["good"], runs["bad"]))
    legend = view.locator(".jp-nbdist-compareLegend").inner_text()
    assert f"#{runs['good']} good" in legend and f"#{runs['bad']} bad" in legend
    assert view.get_attribute("data-metric") is None  # (the body holds it)
    body = view.locator(".jp-nbdist-RunView-body")
    assert body.get_attribute("data-metric") == "loss"
    options = view.locator("select option").all_inner_texts()
    assert options == ["loss", "acc", "val_loss"]
    view.get_by_label("metric to compare").select_option("val_loss")
    page.wait_for_function("el => el.dataset.metric === 'val_loss'", arg=body.element_handle())
    chart = view.locator(".nbdist-chart")
    page.wait_for_function(
        "el => el.dataset.lines === '2' && el.textContent.includes('val_loss')",
        arg=chart.element_handle(),
    )
    wait_until(lambda: _chart_is_sharp(chart), 10, what="a sharp canvas")
    page.mouse.move(5, 5)
    shot(page, "compare", dark_too=True)


MESH = """\
%%distributed --name mesh --timeout 120
import time, torch
mesh = nbdist.mesh(dp=2, tp=2)

class Steps(torch.utils.data.Dataset):  # rank 2's batches come late: its tile says so
    def __len__(self):
        return 160

    def __getitem__(self, i):
        time.sleep(0.03 if nbdist.rank() == 2 else 0.0)
        return i

for step, _ in enumerate(nbdist.loader(Steps(), 1, shuffle=False)):
    nbdist.report(step=step, loss=1.0 / (step + 1), samples=32)
    time.sleep(0.02 if nbdist.rank() == 2 else 0.05)
"""


def test_each_ranks_place_in_the_mesh_is_on_its_tile(page, kernel):
    """A dp × tp mesh on 4 engines: each tile shows its rank's coordinates, the legend which
    dimensions they are, its tooltip the whole; on the card and in the run's view. Each tile
    also shows the share of its steps the rank waited for data (rank 2's Dataset is slow), and
    the run's view charts it."""
    kernel.run("%nbdist stop")  # the module's 2 engines, when an earlier test left them running
    kernel.ok("%nbdist start -n 4", timeout=180)
    try:
        assert kernel.ok(MESH).error is None
    finally:
        kernel.ok("%nbdist stop")
    run_id = _latest_run_id(kernel)
    c = card(page, run_id)
    coords = c.locator(".jp-nbdist-workerMesh")
    wait_until(lambda: coords.count() == 4, 30, what="four tiles with coordinates on the card")
    assert [coords.nth(i).get_attribute("data-mesh") for i in range(4)] == [
        "dp 0/2 tp 0/2",
        "dp 0/2 tp 1/2",
        "dp 1/2 tp 0/2",
        "dp 1/2 tp 1/2",
    ]
    assert coords.all_inner_texts() == ["0·0", "0·1", "1·0", "1·1"]
    assert c.get_by_test_id("nbdist-mesh-key").inner_text() == "mesh: dp·tp of 2×2"
    assert "dp 1/2 tp 0/2" in c.locator('.jp-nbdist-worker[data-rank="2"]').get_attribute("title")
    waits = c.locator(".jp-nbdist-workerData")
    wait_until(lambda: waits.count() == 4, 30, what="each tile's data share")
    shares = [float(waits.nth(i).get_attribute("data-share")) for i in range(waits.count())]
    assert len(shares) == 4 and shares[2] > 0.4 and max(shares[:2] + shares[3:]) < 0.2, shares
    assert re.fullmatch(r"data \d+%", waits.nth(2).inner_text())
    shot(page, "mesh", dark_too=True)
    c.get_by_role("button", name="Open run").click()
    view = page.locator(f"#nbdist-run-{run_id}")
    tiles = view.locator(".jp-nbdist-workerMesh")
    wait_until(lambda: tiles.count() == 4, 30, what="the coordinates in the run's view")
    assert tiles.all_inner_texts() == ["0·0", "0·1", "1·0", "1·1"]
    chart = view.locator(".jp-nbdist-chartBox[data-metric='data_share']")
    wait_until(lambda: chart.count() == 1, 30, what="the data share's chart in the run's view")
    view.locator(".jp-nbdist-workers").scroll_into_view_if_needed()
    shot(page, "mesh-detail", dark_too=True)
