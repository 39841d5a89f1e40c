"""The dashboard: a real kernel and cluster run a training cell; the widget and the store agree."""

from __future__ import annotations

import ast
import base64
import queue
import time

import pytest

from nbdist.config import TelemetryConfig
from nbdist.notebook.collector import Collector
from nbdist.notebook.dashboard import Dashboard
from nbdist.telemetry.events import Batch, HealthSample, MetricRecord, RunEvent

WIDGET = "application/vnd.jupyter.widget-view+json"
EVIL = "<img src=x onerror=alert(1)>"


# -- without a kernel ----------------------------------------------------------------------------
def _collector() -> Collector:
    col = Collector([0, 1], TelemetryConfig())
    now = time.time()
    for r in (0, 1):
        recs = [
            MetricRecord(now - 1 + i * 0.1, i, 1.0 / (i + 1) + r, 16, 20, None) for i in range(10)
        ]
        col.ingest(
            r,
            Batch(
                r, 1, now, recs, HealthSample(now, f"{EVIL}{r}", 100 + r, cpu=5.0, rss=2**20 * 100)
            ),
        )
        col.ranks[r].log.extend([f"{EVIL} line {r}", "<script>alert(2)</script>"])
    return col


def test_engine_strings_are_shown_as_text_never_html():
    col = _collector()
    d = Dashboard(f"run {EVIL}")
    events = [RunEvent(time.time(), "died", 1, EVIL, None)]
    d.update(col, events, "running", final=True)
    for html_widget in (d.header, d.table, d.events_box):
        assert "<img" not in html_widget.value and "<script" not in html_widget.value
    assert "&lt;img src=x onerror=alert(1)&gt;0" in d.table.value
    assert "&lt;img" in d.events_box.value and "&lt;img" in d.header.value
    assert f"[rank 0] {EVIL} line 0" in d.logs.value  # a Textarea: plain text, as written
    assert d.progress.value == 10 and d.progress.max == 20
    assert "step 10 / 20" in d.status.value and "50%" in d.status.value


def test_the_static_picture_is_a_png_of_the_whole_board():
    col = _collector()
    d = Dashboard("run 1")
    d.update(col, [], "ok", final=True)
    png = d.picture(col, [RunEvent(time.time(), "nan", 1, "x", None)], "ok")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert d.chart.value[:8] == b"\x89PNG\r\n\x1a\n"
    assert [r["state"] for r in d.rows] == ["ok", "ok"]


# -- a real kernel -------------------------------------------------------------------------------
def _run(kernel, code: str, timeout: float = 120) -> list[dict]:
    """Run a cell; return every iopub message it caused (a front end sees the same)."""
    msg_id = kernel.kc.execute(code)
    msgs, deadline = [], time.monotonic() + timeout
    while True:
        try:
            msg = kernel.kc.get_iopub_msg(timeout=0.1)
        except queue.Empty:
            assert time.monotonic() < deadline, f"cell did not finish: {code[:60]}"
            continue
        msg["_at"] = time.monotonic()
        msgs.append(msg)
        if (
            msg["parent_header"].get("msg_id") == msg_id
            and msg["msg_type"] == "status"
            and msg["content"]["execution_state"] == "idle"
        ):
            return msgs


def _errors(msgs) -> list[str]:
    return [
        f"{m['content']['ename']}: {m['content']['evalue']}"
        for m in msgs
        if m["msg_type"] == "error"
    ]


def _value(kernel, expr: str):
    return ast.literal_eval(kernel.ok(f"print(repr({expr}))").stdout.strip())


@pytest.fixture(scope="module")
def ready(kernel):
    kernel.ok("%nbdist start -n 2")
    kernel.ok("from nbdist.notebook import monitor as _runs")
    yield kernel
    kernel.ok("%nbdist stop")


TRAIN = """%%distributed --total 40 --name demo
import time
for i in range(40):
    nbdist.report(step=i, loss=(nbdist.rank() + 1) / (i + 1), samples=16)
    if i % 10 == 0:
        print(f"step {i} <b>bold?</b>")
    time.sleep(0.06)
"""


def test_training_cell_shows_a_live_dashboard_and_keeps_the_run(ready):
    k = ready
    msgs = _run(k, TRAIN)
    assert _errors(msgs) == []
    shown = [m for m in msgs if m["msg_type"] == "display_data" and WIDGET in m["content"]["data"]]
    assert len(shown) == 1
    # it changed while the cell ran, at least twice a second
    label_updates = [
        m["_at"]
        for m in msgs
        if m["msg_type"] == "comm_msg"
        and m["content"]["data"].get("method") == "update"
        and "step " in str(m["content"]["data"].get("state", {}).get("value", ""))
    ]
    span = label_updates[-1] - label_updates[0]
    assert len(label_updates) >= 2 * span >= 2 * 1.5, (len(label_updates), span)
    # the final output keeps the widget and adds a picture of it
    final = [m for m in msgs if m["msg_type"] == "update_display_data"]
    assert len(final) == 1
    data = final[0]["content"]["data"]
    assert WIDGET in data and base64.b64decode(data["image/png"])[:4] == b"\x89PNG"
    assert data[WIDGET]["model_id"] == shown[0]["content"]["data"][WIDGET]["model_id"]

    state = _value(
        k,
        "(lambda d: (d.progress.value, d.progress.max, d.status.value, "
        "[(r['rank'], r['step'], r['loss'], r['state']) for r in d.rows]))"
        "(_runs.last().dashboard)",
    )
    value, maximum, status, rows = state
    assert (value, maximum) == (40, 40) and status.startswith("step 40 / 40 · 100%")
    assert rows == [(0, 39, pytest.approx(1 / 40), "ok"), (1, 39, pytest.approx(2 / 40), "ok")]
    assert "step 30 <b>bold?</b>" in _value(k, "_runs.last().dashboard.logs.value")

    listing = _value(
        k,
        "[(r['name'], r['status'], r['world_size'], r['step'], r['total']) "
        "for r in __import__('nbdist').runs(limit=1)]",
    )
    assert listing == [("demo", "ok", 2, 40, 40)]
    options = _value(k, "__import__('nbdist').runs(limit=1)[0]['options']")
    assert options["total"] == 40 and options["dashboard"] is True and "timeout" in options
    rows = _value(
        k,
        "[(m['rank'], m['step'], m['loss']) for m in "
        "__import__('nbdist').runs(limit=1)[0].metrics(as_frame=False)]",
    )
    assert len(rows) == 80 and (1, 39, pytest.approx(2 / 40)) in rows
    p95 = _value(k, "sorted(_runs.last().latencies)[int(0.95 * len(_runs.last().latencies))]")
    assert p95 < 1.0  # the benchmark measures it properly; this only catches a stuck pipeline


def test_no_dashboard_option_and_runs_still_recorded(ready):
    msgs = _run(ready, TRAIN.replace("--name demo", "--no-dashboard --name quiet"))
    assert _errors(msgs) == []
    assert not [m for m in msgs if m["msg_type"] == "display_data"]
    assert _value(ready, "__import__('nbdist').runs(limit=1)[0]['name']") == "quiet"


def test_compare_plots_two_runs(ready):
    msgs = _run(ready, "import nbdist\nfig = nbdist.compare(*nbdist.runs(limit=2))\nfig")
    assert _errors(msgs) == []
    pngs = [
        m for m in msgs if m["msg_type"] == "execute_result" and "image/png" in m["content"]["data"]
    ]
    assert len(pngs) == 1
    msgs = _run(ready, "nbdist.compare(10**6)")
    assert _errors(msgs) == [
        "UsageError: there is no run 1000000: nbdist.runs() lists the kept ones"
    ]


@pytest.mark.parametrize(
    "line, message",
    [
        ("--total 0", "expected a whole number >= 1, not '0'"),
        ("--tensorboard /tmp/nbdist-tb", "--tensorboard needs the tensorboard package"),
    ],
)
def test_bad_options_are_one_line(ready, line, message):
    if "tensorboard" in line:
        try:
            import torch.utils.tensorboard  # noqa: F401

            pytest.skip("tensorboard is installed here")
        except ImportError:
            pass
    errs = _errors(_run(ready, f"%%distributed {line}\nx = 1\n"))
    assert len(errs) == 1 and message in errs[0] and "\n" not in errs[0]


def test_an_unwritable_store_warns_once_and_training_goes_on(ready, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    k = ready
    k.ok(
        f"import os; _old = os.environ['NBDIST_DATA_DIR']; "
        f"os.environ['NBDIST_DATA_DIR'] = {str(blocker / 'data')!r}"
    )
    try:
        res = k.run(TRAIN.replace("40", "8").replace("--name demo", "") + "nbdist.rank() + 7")
    finally:
        k.ok("os.environ['NBDIST_DATA_DIR'] = _old")
    assert res.error is None and res.result == "7"
    assert res.stderr.count("nbdist: warning: the run store") == 1
    assert "training goes on" in res.stderr
    assert _value(k, "_runs.last().dashboard.progress.value") == 8


def test_stop_on_nan_through_the_magic(ready):
    msgs = _run(
        ready,
        """%%distributed --stop-on-nan
import time
for i in range(300):
    nbdist.report(step=i, loss=float('inf') if (nbdist.rank() == 0 and i == 3) else 1.0)
    time.sleep(0.02)
""",
    )
    assert _errors(msgs) == [
        "DistributedCellError: rank 0: loss is not finite: loss is inf at step 3 "
        "(stopped by --stop-on-nan)"
    ]
    assert "loss is inf on rank 0" in _value(ready, "_runs.last().dashboard.alert.value")
    run = _value(
        ready,
        "(lambda r: (r['status'], r['nonfinite'], r['step'] < 300))"
        "(__import__('nbdist').runs(limit=1)[0].record)",
    )
    assert run == ("stopped", "inf", True)


def test_an_interrupted_run_is_kept_as_interrupted(ready):
    res = ready.run(
        "%%distributed\nimport time\nfor i in range(1000):\n"
        "    nbdist.report(step=i, loss=1.0)\n    time.sleep(0.01)\n",
        interrupt_after=1.5,
        timeout=60,
    )
    assert res.error is not None and res.error["ename"] == "KeyboardInterrupt"
    assert _value(ready, "__import__('nbdist').runs(limit=1)[0]['status']") == "interrupted"
    assert _value(ready, "_runs.last().dashboard.progress.bar_style") == "danger"


# -- a real browser ------------------------------------------------------------------------------
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = __import__("pathlib").Path(__file__).resolve().parents[2] / "test-artifacts"
BROWSER_TRAIN = """%%distributed --total 300 --name browser
import math, time
for i in range(300):
    nbdist.report(step=i, loss=(1 + 0.3 * nbdist.rank()) * math.exp(-i / 80) + 0.05, samples=32)
    if i % 50 == 0:
        print(f"step {i}")
    time.sleep(0.05)
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A real ``jupyter lab`` on a free loopback port; its kernels keep records in a temp dir."""
    import json
    import os
    import secrets
    import socket
    import subprocess
    import sys
    import urllib.request

    import psutil
    from conftest import assert_gone, wait_until

    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent: run scripts/install-system-deps.sh")
    pytest.importorskip("playwright.sync_api")
    base = tmp_path_factory.mktemp("dash-lab")
    root = base / "root"
    root.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    news = base / "settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    cells = ["%load_ext nbdist\n%nbdist start -n 2", BROWSER_TRAIN, "%nbdist stop"]
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {},
                "source": c,
                "outputs": [],
                "execution_count": None,
            }
            for c in cells
        ],
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (root / "dash.ipynb").write_text(json.dumps(nb))
    env = {**os.environ, "NBDIST_DATA_DIR": str(base / "data")}
    log = open(base / "lab.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--allow-root",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}",
            f"--LabApp.user_settings_dir={base / 'settings'}",
            f"--LabApp.workspaces_dir={base / 'workspaces'}",
            "--LabApp.expose_app_in_browser=True",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/"

    def up():
        assert proc.poll() is None, (base / "lab.log").read_text()[-3000:]
        try:
            req = urllib.request.Request(
                url + "api/status", headers={"Authorization": f"token {token}"}
            )
            with urllib.request.urlopen(req, timeout=5):
                return True
        except OSError:
            return False

    try:
        wait_until(up, 90, interval=0.25, what="jupyter lab to answer")
        yield url, token, root
    finally:
        pids = [proc.pid] + [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        assert_gone(pids, timeout=30)


@pytest.mark.timeout(400)
def test_dashboard_in_a_real_browser(lab):
    """JupyterLab in Chromium runs the notebook: the widget shows, its loss curve moves, its
    worker table lists both ranks; screenshots go to test-artifacts/."""
    from playwright.sync_api import sync_playwright

    url, token, root = lab
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--no-first-run"],
        )
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1100})
            page.set_default_timeout(90_000)
            page.goto(f"{url}lab/tree/dash.ipynb?token={token}")
            page.wait_for_selector(".jp-Notebook .jp-Cell")
            page.wait_for_function(
                "window.jupyterapp && window.jupyterapp.shell.currentWidget"
                " && window.jupyterapp.shell.currentWidget.sessionContext"
                " && window.jupyterapp.shell.currentWidget.sessionContext"
                ".session && window.jupyterapp.shell.currentWidget"
                ".sessionContext.session.kernel"
            )
            # not awaited: the command's promise settles only when every cell has run
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
            table = page.locator(".jupyter-widgets table:has-text('step ms')")
            table.wait_for()
            chart = page.locator(".jupyter-widgets img").first
            page.wait_for_function(  # the step column (4th) has passed 40, the run goes on
                "() => [...document.querySelectorAll('.jupyter-widgets table tr')].some(tr =>"
                " tr.children.length > 3 && +tr.children[3].textContent >= 40)"
            )
            assert "running" in page.locator(".jupyter-widgets").first.inner_text()
            first = chart.get_attribute("src")
            chart.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "dashboard-live-1.png"), full_page=True)
            page.wait_for_function(
                "s => document.querySelector('.jupyter-widgets img').src !== s", arg=first
            )  # the curve moved
            page.screenshot(path=str(ARTIFACTS / "dashboard-live-2.png"), full_page=True)
            text = table.inner_text()
            assert "ok" in text and text.count("\n") >= 2  # a header and a row per rank
            page.locator(".jupyter-widgets:has-text('step 300 / 300')").first.wait_for(
                timeout=120_000
            )
            page.screenshot(path=str(ARTIFACTS / "dashboard-final.png"), full_page=True)
            assert "100%" in page.locator(".jupyter-widgets").first.inner_text()
            page.get_by_text("nbdist: cluster stopped").wait_for(timeout=60_000)
            page.evaluate("window.jupyterapp.commands.execute('docmanager:save')")
        finally:
            browser.close()
    # the saved notebook carries a picture of the board for renderers without widgets
    import json

    outputs = json.loads((root / "dash.ipynb").read_text())["cells"][1]["outputs"]
    boards = [
        o for o in outputs if o.get("output_type") == "display_data" and WIDGET in o.get("data", {})
    ]
    assert len(boards) == 1 and base64.b64decode(boards[0]["data"]["image/png"])[:4] == b"\x89PNG"
