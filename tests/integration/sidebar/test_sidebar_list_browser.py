"""The sidebar's runs table in a real JupyterLab, through Chromium: every run findable.

The store holds what half an hour of work leaves: 45 runs (named ones among them: ``cnn-lr0.05``,
``fail-demo``), each with its summary and its curve, the session's other cells (``print("hi")``:
listed only with "all cells"), and last a run of 64 ranks. The table pages through every run
(``1–20 of 46``, next, prev), finds runs by a part of the name in any case, filters by status,
sorts by any summary metric from the column's header, and shows the columns chosen; runs ticked
on two pages are compared. The card of the 64-rank run is a compact grid, a cell per rank
coloured by its state (hollow: a rank that waited for data most of its steps), with the table
of every rank a click away; its run view charts each
metric as the mean, the band of the 64 ranks' values (shaded) and the outlier rank's own line,
named. ipyparallel's own cluster panel is not in the lab. Screenshots, light and dark:
test-artifacts/screenshots/sidebar-runs-*.

Needs /usr/bin/chromium (``scripts/install-system-deps.sh`` installs it).
"""

from __future__ import annotations

import json
import re
import time

import pytest
from lab import chromium_page
from paths import ROOT
from processes import wait_until

# the browser, its flags and the screenshots are the sidebar test's (the lab, its data folder
# and the shadows of pytest-jupyter's autouse fixtures: conftest.py)
from test_sidebar_browser import opened_compare, pytestmark, shot, sidebar  # noqa: F401

from nbdist.telemetry.store import RunStore

RUNS = 45
RANKS = 64
#: Each rank's final state in the wide run: most done, some failed, one dead, some stopped.
WIDE_STATES = {5: "failed", 17: "dead", 40: "failed", 41: "stopped", 42: "stopped"}
#: The wide run's outlier: its loss climbs away from the others'.
OUTLIER = 40
#: The wide run's ranks starved by their input: each waited 80 % of its steps for data (the
#: others 5 %).
STARVED = (3, 11, 19)


def _name(i: int) -> str:
    if i == 7:
        return "cnn-lr0.05"
    if i == 30:
        return "fail-demo"
    return f"{'cnn' if i % 3 == 0 else 'mlp'}-{i:02d}" if i % 4 else ""


def _wide_rows(t0: float) -> list[dict]:
    """The wide run's loss and acc over 60 steps: the ranks spread about their mean, rank 40's
    loss (it failed) climbing away from the others' from step 20 on."""
    rows = []
    for k in range(60):
        for r in range(RANKS):
            loss = (1.0 + 0.002 * r) * (1 - k / 80)
            if r == OUTLIER and k >= 20:
                loss *= 1 + (k - 20) / 10
            rows.append({"time": t0 + k / 10, "rank": r, "step": k, "loss": loss,
                         "extra": {"acc": 0.3 + 0.01 * k + 0.001 * r}})  # fmt: skip
    return rows


@pytest.fixture(scope="module")
def made(data) -> dict[str, int]:
    """The runs, written to the lab's store as the kernel writes them; their ids by name."""
    s = RunStore()
    now = time.time() - 3600
    ids: dict[str, int] = {}
    for i in range(RUNS):
        failed = i == 30 or i % 11 == 5
        rid = s.start_run(name=_name(i), world_size=2, started=now + 60 * i)
        final = 0.05 + ((i * 17) % RUNS) / 10  # each run's last loss: all different
        rows = [
            {"time": now + 60 * i + k, "rank": r, "step": k, "loss": final * (1 + (30 - k) / 10)}
            for k in range(31)
            for r in (0, 1)
        ]
        s.add_metrics(rid, rows)
        s.put_summary(rid, {"loss": (final, final, final * 4), "acc": (i / 100, 0.0, i / 100)})
        s.update_run(rid, step=31, loss=final)
        s.end_run(rid, "failed" if failed else "ok", ended=now + 60 * i + 20 + i)
        ids[f"i{i}"] = rid
        if _name(i):
            ids[_name(i)] = rid
    for _ in range(3):  # cells of the session: print("hi"), the model's definition
        s.end_run(s.start_run(started=now + 60 * RUNS), "ok")
    wide = s.start_run(name="wide-64", world_size=RANKS, started=time.time() - 30)
    s.put_summary(wide, {"loss": (0.2, 0.2, 1.0)})
    s.add_metrics(wide, _wide_rows(time.time() - 30))
    s.put_health(
        wide,
        [
            {
                "rank": r,
                "time": time.time(),
                "host": f"node{r // 8}",
                "state": WIDE_STATES.get(r, "done"),
                "cpu": 50.0 + r,
                "data_share": 0.8 if r in STARVED else 0.05,
            }
            for r in range(RANKS)
        ],
    )
    s.end_run(wide, "failed")
    ids["wide-64"] = wide
    s.close()
    return ids


@pytest.fixture(scope="module")
def page(lab, made):
    with chromium_page(lab, width=1400, height=1000) as pg:
        pg.click('li[data-id="nbdist-sidebar"]')
        sidebar(pg).locator(".jp-nbdist-pastRun").first.wait_for()
        yield pg


def _rows(page):
    return sidebar(page).locator(".jp-nbdist-pastRun")


def _count(page) -> str:
    return sidebar(page).get_by_test_id("nbdist-runs-count").inner_text()


def _names(page) -> list[str]:
    return sidebar(page).locator(".jp-nbdist-pastRun .jp-nbdist-runName").all_inner_texts()


def _wait_count(page, text: str) -> None:
    wait_until(lambda: _count(page) == text, 15, interval=0.1, what=f"the table to say {text}")


def _close(page, widget_id: str) -> None:
    """Close the main area's widget ``widget_id`` (a compare or run view)."""
    page.evaluate(
        "id => { for (const w of window.jupyterapp.shell.widgets('main')) if (w.id === id) "
        "w.close(); }",
        widget_id,
    )


def test_ipyparallels_own_cluster_panel_is_not_in_the_lab(page):
    assert page.locator('li[data-id="nbdist-sidebar"]').count() == 1
    assert page.locator('li[data-id="ipp-cluster-launcher"]').count() == 0
    disabled = page.evaluate(
        "JSON.parse(document.getElementById('jupyter-config-data').textContent).disabledExtensions"
    )
    assert "ipyparallel-labextension" in disabled
    shipped = (ROOT / "pyproject.toml").read_text()  # an install puts it where this lab read it
    assert '"jupyter-config/labconfig/page_config.d" = "etc/jupyter/labconfig/page_config.d"' in (
        shipped
    )
    config = ROOT / "jupyter-config" / "labconfig" / "page_config.d" / "nbdist.json"
    assert json.loads(config.read_text())["disabledExtensions"] == {
        "ipyparallel-labextension": True
    }


def test_the_table_pages_through_every_run(page, made):
    panel = sidebar(page)
    _wait_count(page, f"1–20 of {RUNS + 1}")
    assert panel.get_by_text(f"Runs ({RUNS + 1})").count() == 1
    first = _names(page)
    assert first[0] == "wide-64" and len(first) == 20
    panel.get_by_role("button", name="next ›").click()
    _wait_count(page, f"21–40 of {RUNS + 1}")
    second = _names(page)
    assert len(second) == 20 and not set(second) & set(first) - {""}
    assert "fail-demo" in second or "fail-demo" in first
    panel.get_by_role("button", name="next ›").click()
    _wait_count(page, f"41–{RUNS + 1} of {RUNS + 1}")
    assert _rows(page).count() == RUNS + 1 - 40
    assert panel.get_by_role("button", name="next ›").is_disabled()
    shot(page, "runs-last-page")
    panel.get_by_role("button", name="‹ prev").click()
    _wait_count(page, f"21–40 of {RUNS + 1}")
    # the session's other cells, asked for
    panel.get_by_role("button", name="‹ prev").click()
    _wait_count(page, f"1–20 of {RUNS + 1}")
    panel.get_by_label("all cells").check()
    _wait_count(page, f"1–20 of {RUNS + 4}")
    wait_until(
        lambda: panel.locator('.jp-nbdist-pastRun[data-listed="false"]').count() == 3,
        15,
        what="the three cells that are not runs",
    )
    panel.get_by_label("all cells").uncheck()
    _wait_count(page, f"1–20 of {RUNS + 1}")
    # polling stays light: every read of the runs is the page in view, or the live run's
    asked = page.evaluate(RUNS_READS)
    assert len(asked) > 5 and all(re.search(r"[?&]limit=(20|1)(&|$)", a) for a in asked), asked


#: Every read of the runs the page made, from the browser's resource timing.
RUNS_READS = """() => performance.getEntriesByType('resource').map(e => e.name)
  .filter(n => n.split('?')[0].endsWith('/nbdist/api/runs'))"""


def test_search_filter_and_sort_by_a_summary_metric(page, made):
    panel = sidebar(page)
    search = panel.get_by_label("search runs by name")
    search.fill("CNN")
    wait_until(
        lambda: _names(page) and all("cnn" in n for n in _names(page)),
        15,
        what="only the cnn runs",
    )
    cnn = [n for i in range(RUNS) if "cnn" in (n := _name(i))]
    _wait_count(page, f"1–{len(cnn)} of {len(cnn)}")
    search.fill("lr0.05")
    wait_until(lambda: _names(page) == ["cnn-lr0.05"], 15, what="the run named cnn-lr0.05")
    search.fill("")
    panel.get_by_label("status filter").select_option("failed")
    failed = [i for i in range(RUNS) if i == 30 or i % 11 == 5]
    _wait_count(page, f"1–{len(failed) + 1} of {len(failed) + 1}")  # and the wide run
    statuses = _rows(page).evaluate_all("rows => rows.map(r => r.dataset.status)")
    assert set(statuses) == {"failed"}
    panel.get_by_label("status filter").select_option("")
    _wait_count(page, f"1–20 of {RUNS + 1}")

    # the loss column's header sorts by the runs' last loss, least first, then the other way
    loss = panel.locator('.jp-nbdist-runTable th[data-column="loss"]')
    loss.click()
    expected = sorted([0.05 + ((i * 17) % RUNS) / 10 for i in range(RUNS)] + [0.2])

    def column() -> list[float]:
        cells = panel.locator('.jp-nbdist-pastRun td[data-column="loss"]').all_inner_texts()
        return [float(c) for c in cells]

    wait_until(
        lambda: column() == pytest.approx(expected[:20], rel=1e-3),
        15,
        what="the least losses first",
    )
    assert loss.get_attribute("aria-sort") == "ascending"
    assert panel.get_by_label("sort runs by").input_value() == "loss"
    page.mouse.move(5, 5)
    shot(page, "runs-sorted", dark_too=True)
    loss.click()
    wait_until(
        lambda: column() == pytest.approx(expected[::-1][:20], rel=1e-3),
        15,
        what="the greatest losses first",
    )
    # any metric of the summaries, from the sort menu: its greatest value, the greatest first
    panel.get_by_label("sort runs by").select_option("max:acc")
    panel.get_by_label("ascending: click for descending").click()
    top = str(made[f"i{RUNS - 1}"])
    wait_until(
        lambda: _rows(page).first.get_attribute("data-run-id") == top,
        15,
        what="the run of the greatest acc first",
    )
    panel.get_by_label("sort runs by").select_option("time")
    _wait_count(page, f"1–20 of {RUNS + 1}")


def test_columns_are_chosen_and_kept(page):
    panel = sidebar(page)
    head = panel.locator(".jp-nbdist-runTable thead th")
    assert [t.split()[0] for t in head.all_inner_texts()[1:]] == ["name", "step", "loss", "time"]
    panel.locator(".jp-nbdist-columns > summary").click()
    panel.locator(".jp-nbdist-columnList").get_by_label("acc").check()
    panel.locator(".jp-nbdist-columnList").get_by_label("step").uncheck()
    panel.locator(".jp-nbdist-columns > summary").click()
    wait_until(
        lambda: [t.split()[0] for t in head.all_inner_texts()[2:]] == ["loss", "time", "acc"],
        15,
        what="the columns chosen",
    )
    acc = panel.locator('.jp-nbdist-pastRun td[data-column="acc"]').all_inner_texts()
    assert all(re.fullmatch(r"[0-9.e+-]+|–", a) for a in acc) and len(acc) == 20
    page.reload()
    page.wait_for_selector("#jp-main-dock-panel")
    page.click('li[data-id="nbdist-sidebar"]')
    sidebar(page).locator(".jp-nbdist-pastRun").first.wait_for()
    assert [t.split()[0] for t in head.all_inner_texts()[2:]] == ["loss", "time", "acc"]


def test_runs_ticked_on_two_pages_are_compared(page, made):
    panel = sidebar(page)
    _wait_count(page, f"1–20 of {RUNS + 1}")
    a = made["cnn-lr0.05"]
    panel.get_by_label("search runs by name").fill("fail-demo")
    wait_until(lambda: _names(page) == ["fail-demo"], 15, what="fail-demo")
    panel.locator(
        f'.jp-nbdist-pastRun[data-run-id="{made["fail-demo"]}"] .jp-nbdist-select'
    ).check()
    panel.get_by_label("search runs by name").fill("")
    _wait_count(page, f"1–20 of {RUNS + 1}")
    panel.get_by_role("button", name="next ›").click()
    _wait_count(page, f"21–40 of {RUNS + 1}")
    row = panel.locator(f'.jp-nbdist-pastRun[data-run-id="{a}"]')
    if row.count() == 0:  # on another page: found by its name
        panel.get_by_label("search runs by name").fill("lr0.05")
        wait_until(lambda: _names(page) == ["cnn-lr0.05"], 15, what="cnn-lr0.05")
    row.locator(".jp-nbdist-select").check()
    panel.get_by_text("2 runs selected").wait_for()
    shot(page, "runs-selected", dark_too=True)
    view = opened_compare(page, panel, (a, made["fail-demo"]))
    ids = "-".join(str(i) for i in sorted((a, made["fail-demo"])))
    legend = view.locator(".jp-nbdist-compareLegend").inner_text()
    assert f"#{a} cnn-lr0.05" in legend and f"#{made['fail-demo']} fail-demo" in legend
    page.mouse.move(5, 5)
    shot(page, "runs-compare", dark_too=True)
    _close(page, f"nbdist-compare-{ids}")
    panel.get_by_role("button", name="Clear").click()
    panel.get_by_label("search runs by name").fill("")


def test_a_64_rank_runs_card_is_a_grid_with_its_table_a_click_away(page, made):
    card = sidebar(page).locator(f'.jp-nbdist-run[data-run-id="{made["wide-64"]}"]')
    card.wait_for()
    cells = card.locator(".jp-nbdist-rankCell")
    wait_until(lambda: cells.count() == RANKS, 15, what="a cell per rank")
    assert card.locator(".jp-nbdist-workerRank").count() == 0  # no tiles at 64
    states = cells.evaluate_all("cs => cs.map(c => c.dataset.state)")
    assert states == [WIDE_STATES.get(r, "done") for r in range(RANKS)]
    assert "rank 17 · on node2 · dead" in cells.nth(17).get_attribute("title")
    box = cells.nth(0).bounding_box()
    assert box["width"] <= 14 and box["height"] <= 14  # small: 64 fit the sidebar's width
    legend = card.locator(".jp-nbdist-legend").inner_text()
    assert "done 59" in legend and "failed 2" in legend and "dead 1" in legend
    # the ranks starved by their input are hollow, counted in the legend
    hollow = card.locator(".jp-nbdist-rankCell.nbdist-input-bound")
    assert hollow.evaluate_all("cs => cs.map(c => +c.dataset.rank)") == list(STARVED)
    assert "waiting for data ≥ 50 % 3" in legend
    assert "waiting for data 80 % of the step" in cells.nth(STARVED[0]).get_attribute("title")
    card.get_by_role("button", name=f"table of {RANKS} ranks").click()
    rows = card.locator(".jp-nbdist-rankTable tbody tr")
    wait_until(lambda: rows.count() == RANKS, 15, what="a row per rank")
    first = rows.evaluate_all("rs => rs.slice(0, 5).map(r => [+r.dataset.rank, r.dataset.state])")
    assert first == [[5, "failed"], [17, "dead"], [40, "failed"], [41, "stopped"], [42, "stopped"]]
    assert "data %" in card.locator(".jp-nbdist-rankTable thead th").all_inner_texts()
    data = card.locator(".jp-nbdist-rankTable tr[data-rank='3'] .jp-nbdist-dataShare")
    assert data.inner_text() == "80"
    card.locator(".jp-nbdist-rankCells").scroll_into_view_if_needed()
    page.mouse.move(5, 5)
    shot(page, "runs-wide-card", dark_too=True)


def test_a_64_rank_runs_view_draws_the_band_and_names_its_outlier(page, made):
    wide = made["wide-64"]
    panel = sidebar(page)
    panel.get_by_label("search runs by name").fill("wide-64")
    _wait_count(page, "1–1 of 1")
    panel.locator(f'.jp-nbdist-pastRun[data-run-id="{wide}"] .jp-nbdist-runOpen').click()
    view = page.locator(f"#nbdist-run-{wide}")
    view.wait_for()
    loss = view.locator('.jp-nbdist-chartBox[data-metric="loss"] .nbdist-chart')
    acc = view.locator('.jp-nbdist-chartBox[data-metric="acc"] .nbdist-chart')
    title = f"loss: mean, min\u2013max band of {RANKS} ranks, outliers {OUTLIER}"
    head = loss.locator(".nbdist-chart-title")
    wait_until(lambda: head.inner_text() == title, 30, what=f"the title {title!r}")
    assert (
        acc.locator(".nbdist-chart-title").inner_text()
        == f"acc: mean, min\u2013max band of {RANKS} ranks"
    )
    # max (shaded down to min), min, mean and rank 40's line; acc: no outlier
    page.wait_for_function("el => el.dataset.lines === '4'", arg=loss.element_handle())
    page.wait_for_function("el => el.dataset.lines === '3'", arg=acc.element_handle())
    readout = loss.locator(".nbdist-chart-readout").inner_text()
    assert f"rank {OUTLIER}" in readout and "max" in readout and "min" in readout, readout
    assert "rank 0 " not in readout  # no line per rank
    loss.scroll_into_view_if_needed()
    page.mouse.move(5, 5)
    shot(page, "runs-wide-view", dark_too=True)
    _close(page, f"nbdist-run-{wide}")
    panel.get_by_label("search runs by name").fill("")
