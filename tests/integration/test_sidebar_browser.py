"""The sidebar in a real JupyterLab, driven through Chromium as a person would use it.

A real ``jupyter lab`` (nbdist's server and lab extensions installed with the package) and
Debian's Chromium under Playwright: open the panel, start a cluster from it, attach a notebook
kernel to that cluster and train, watch the run's step advance, kill a worker and see it marked
dead, stop the cluster. Screenshots, in the light and the dark theme, go to test-artifacts/.

Needs /usr/bin/chromium (``scripts/install-system-deps.sh`` installs it).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from conftest import assert_gone, shutdown_kernel, start_kernel, wait_until

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

pytestmark = [
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM),
        reason=f"{CHROMIUM} is absent: run scripts/install-system-deps.sh",
    ),
    pytest.mark.timeout(600),
]
sync_api = pytest.importorskip("playwright.sync_api", reason="Python Playwright is not installed")

TRAIN = """\
%%distributed --timeout 240
import time, torch
torch.manual_seed(0)
model = nbdist.prepare(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step, t_end = 0, time.time() + 120  # ends by itself; the test kills a worker long before
while time.time() < t_end:
    x = torch.randn(32, 8)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    opt.zero_grad(); loss.backward(); opt.step()
    nbdist.report(step=step, loss=loss.item(), samples=32)
    step += 1
    time.sleep(0.02)
"""


@pytest.fixture
def jp_asyncio_loop():
    """Shadows pytest-jupyter's autouse fixture (loaded by test_server.py), which would take
    Playwright's running loop for its own and close it: here it gets a loop of its own."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture
def jp_server_cleanup():
    """Shadows pytest-jupyter's autouse cleanup: no in-process server here (the lab runs in a
    process of its own), and Playwright's loop runs on this thread."""
    yield


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    def __init__(self, url: str, token: str, data: Path, proc: subprocess.Popen):
        self.url, self.token, self.data, self.proc = url, token, data, proc

    def api(self, path: str, method: str = "GET"):
        req = urllib.request.Request(
            self.url + path, method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read() or b"null")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A real ``jupyter lab`` on a free loopback port, with a data directory of its own."""
    base = tmp_path_factory.mktemp("lab")
    data, root = base / "nbdist-data", base / "root"
    root.mkdir()
    old = os.environ.get("NBDIST_DATA_DIR")
    os.environ["NBDIST_DATA_DIR"] = str(data)  # the kernel the test starts shares it
    token, port = secrets.token_hex(16), _free_port()
    cmd = [
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
    ]
    news = base / "settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)  # no "get notified about news?" toast over the screenshots
    (news / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    log = open(base / "lab.log", "w")
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ), start_new_session=True
    )
    lab = Lab(f"http://127.0.0.1:{port}/", token, data, proc)

    def up():
        assert proc.poll() is None, (base / "lab.log").read_text()[-3000:]
        try:
            return lab.api("api/status") is not None
        except OSError:
            return False

    try:
        wait_until(up, 90, interval=0.25, what="jupyter lab to answer")
        yield lab
    finally:
        pids = [proc.pid] + [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        for rec in _records(data):  # a cluster left by a failed test
            _kill(rec["pid"])
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        assert_gone(pids, timeout=30)
        if old is None:
            os.environ.pop("NBDIST_DATA_DIR", None)
        else:
            os.environ["NBDIST_DATA_DIR"] = old


def _records(data: Path) -> list[dict]:
    folder = data / "clusters"
    if not folder.is_dir():
        return []
    return [json.loads(f.read_text()) for f in folder.glob("host-*.json")]


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def page(lab):
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            pg = browser.new_page(viewport={"width": 1280, "height": 860})
            pg.set_default_timeout(60_000)
            pg.goto(f"{lab.url}lab?token={lab.token}")
            pg.wait_for_selector("#jp-main-dock-panel")
            yield pg
        finally:
            browser.close()


def shot(page, name: str, dark_too: bool = False) -> None:
    page.screenshot(path=str(ARTIFACTS / f"sidebar-{name}-light.png"))
    if dark_too:
        set_theme(page, "JupyterLab Dark")
        page.screenshot(path=str(ARTIFACTS / f"sidebar-{name}-dark.png"))
        set_theme(page, "JupyterLab Light")


def set_theme(page, theme: str) -> None:
    page.evaluate(
        "t => window.jupyterapp.commands.execute('apputils:change-theme', {theme: t})", theme
    )
    light = "true" if theme.endswith("Light") else "false"
    page.wait_for_function(f"document.body.dataset.jpThemeLight === '{light}'")
    page.wait_for_timeout(300)  # the theme's stylesheet paints; a screenshot, not a sync point


def sidebar(page):
    return page.locator("#nbdist-sidebar")


def test_panel_opens_with_empty_states(page):
    page.click('li[data-id="nbdist-sidebar"]')
    panel = sidebar(page)
    panel.get_by_text("No cluster yet: start one here").wait_for()
    assert "%nbdist start -n 2" in panel.inner_text()
    assert "No run yet" in panel.inner_text()
    shot(page, "empty", dark_too=True)


def test_unreachable_server_is_said_plainly(page):
    panel = sidebar(page)
    page.route("**/nbdist/api/**", lambda route: route.abort("connectionrefused"))
    try:
        panel.get_by_text("Cannot reach the Jupyter server").wait_for(timeout=15_000)
        shot(page, "unreachable")
    finally:
        page.unroute("**/nbdist/api/**")
    panel.get_by_text("Cannot reach the Jupyter server").wait_for(state="detached", timeout=45_000)


def test_engine_strings_are_text(page, lab):
    from nbdist.telemetry.store import RunStore

    store = RunStore(lab.data / "runs.sqlite")
    rid = store.start_run(name='<img src=x onerror="window.__pwned=1">', world_size=1)
    store.put_health(rid, [{"rank": 0, "time": time.time(), "host": "<b>evil</b>", "state": "ok"}])
    store.end_run(rid, "failed")
    panel = sidebar(page)
    panel.get_by_text('<img src=x onerror="window.__pwned=1">').first.wait_for()
    assert panel.locator("img").count() == 0 and panel.locator("b").count() == 0
    assert page.evaluate("window.__pwned === undefined")
    store.delete_run(rid)
    store.close()


def test_start_train_kill_and_stop(page, lab):
    panel = sidebar(page)
    panel.get_by_label("number of engines").fill("2")
    panel.get_by_role("button", name="Start cluster").click()
    running = panel.locator('.jp-nbdist-cluster[data-state="running"]')
    running.wait_for(timeout=120_000)
    [rec] = _records(lab.data)
    host = rec["pid"]
    cluster_pids = [host] + [p.pid for p in psutil.Process(host).children(recursive=True)]
    assert running.get_attribute("data-cluster-id") == rec["cluster_id"]
    assert running.locator('.jp-nbdist-engine[data-alive="true"]').count() == 2
    shot(page, "cluster")

    import nbdist

    if not hasattr(nbdist, "report"):
        pytest.skip("nbdist.report() does not exist yet: the training part cannot report")
    kernel = start_kernel()
    try:
        out = kernel.ok("%nbdist attach").stdout
        assert f"attached to {rec['cluster_id']}" in out
        sent = kernel.submit(TRAIN)
        live = panel.locator('.jp-nbdist-run[data-status="running"]')
        live.wait_for(timeout=60_000)
        step = panel.get_by_test_id("nbdist-step")

        def step_now() -> int:
            m = re.match(r"\d+", step.inner_text())
            return int(m.group()) if m else -1

        wait_until(lambda: step_now() >= 0, 60, interval=0.2, what="a first step in the panel")
        first = step_now()
        wait_until(
            lambda: step_now() >= first + 20,
            60,
            interval=0.2,
            what="the step to advance in the panel",
        )
        workers = panel.locator(".jp-nbdist-worker")
        wait_until(lambda: workers.count() == 2, 30, what="two workers in the grid")
        wait_until(
            lambda: panel.locator(".jp-nbdist-curve polyline").count() == 1,
            30,
            what="the loss curve",
        )
        shot(page, "live", dark_too=True)

        victim = rec["slots"][1]["pid"]
        os.kill(victim, signal.SIGKILL)
        panel.locator('.jp-nbdist-worker[data-rank="1"][data-state="dead"]').wait_for(
            timeout=30_000
        )
        shot(page, "dead-worker", dark_too=True)
        res = kernel.collect(sent, timeout=120)
        assert res.error is not None and "rank 1" in res.error["evalue"]
        kernel.ok("%nbdist stop")
    finally:
        shutdown_kernel(kernel)

    assert running.count() == 1  # detaching the notebook left the cluster running
    cluster_pids += [p.pid for p in psutil.Process(host).children(recursive=True)]  # + new engine
    running.locator(".jp-nbdist-stopButton").click()
    panel.locator(".jp-nbdist-cluster").wait_for(state="detached", timeout=60_000)
    assert_gone(cluster_pids, timeout=30)
    assert not _records(lab.data)
    panel.get_by_text("No cluster yet").wait_for()
    shot(page, "after", dark_too=True)
