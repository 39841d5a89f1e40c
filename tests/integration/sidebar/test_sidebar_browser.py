"""The sidebar in a real JupyterLab, driven through Chromium as a person would use it.

A real ``jupyter lab`` (nbdist's server and lab extensions installed with the package) and
Debian's Chromium under Playwright: open the panel, start a cluster from it, attach a notebook
kernel to that cluster and train, watch the run's step advance, kill a worker and see it marked
dead, stop the cluster. Screenshots, in the light and the dark theme, go to test-artifacts/.

The time from killing an engine to its worker row showing "dead" is measured over ``KILLS``
runs (kill, then the next run on the repaired cluster): its median must be under a second. The
panel polls a live run's workers about every 250 ms, and once a second when no run is live.

Needs /usr/bin/chromium (``scripts/install-system-deps.sh`` installs it).
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import time
from pathlib import Path

import psutil
import pytest
from kernels import shutdown_kernel, start_kernel
from lab import ARTIFACTS, CHROMIUM, SHOTS, chromium_page
from processes import assert_gone, wait_until

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


@pytest.fixture(scope="module")
def lab(lab, data):
    """The folder's lab (conftest.py); a cluster a failed test left running is stopped before
    the lab is."""
    try:
        yield lab
    finally:
        for rec in _records(data):
            _kill(rec["pid"])


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
    with chromium_page(lab) as pg:
        yield pg


def opened_compare(page, panel, run_ids):
    """Open compare from the runs ticked in the sidebar's ``panel`` (``run_ids``) and wait for
    its chart to draw a line per run; its view."""
    panel.get_by_role("button", name="Compare").click()
    view = page.locator("#nbdist-compare-" + "-".join(str(i) for i in sorted(run_ids)))
    view.wait_for()
    chart = view.locator(".nbdist-chart")
    chart.wait_for()
    lines = str(len(run_ids))
    page.wait_for_function(
        "([el, n]) => el.dataset.lines === n", arg=[chart.element_handle(), lines]
    )
    return view


def shot(page, name: str, dark_too: bool = False) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"sidebar-{name}-light.png"))
    if dark_too:
        set_theme(page, "JupyterLab Dark")
        page.screenshot(path=str(SHOTS / f"sidebar-{name}-dark.png"))
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


def test_engine_strings_are_text(page, data):
    from nbdist.telemetry.store import RunStore

    store = RunStore(data / "runs.sqlite")
    rid = store.start_run(name='<img src=x onerror="window.__pwned=1">', world_size=1)
    store.put_health(rid, [{"rank": 0, "time": time.time(), "host": "<b>evil</b>", "state": "ok"}])
    store.end_run(rid, "failed")
    panel = sidebar(page)
    panel.get_by_text('<img src=x onerror="window.__pwned=1">').first.wait_for()
    assert panel.locator("img").count() == 0 and panel.locator("b").count() == 0
    assert page.evaluate("window.__pwned === undefined")
    store.delete_run(rid)
    store.close()


#: Runs whose rank 1 is killed; the median time to "dead" in the panel is asserted.
KILLS = 3
#: What the sidebar promises (issue 12): a dead rank is shown within this many seconds.
DEAD_WITHIN = 1.0

# Notes, in the page, when the worker row of ``rank`` in the run ``run`` first reads "dead":
# a MutationObserver sees the DOM change itself, so Playwright's polling adds nothing.
WATCH_DEAD = """([run, rank]) => {
  const root = document.getElementById('nbdist-sidebar');
  const sel = `.jp-nbdist-run[data-run-id="${run}"] ` +
    `.jp-nbdist-worker[data-rank="${rank}"][data-state="dead"]`;
  window.__nbdistDeadAt = null;
  const obs = new MutationObserver(() => {
    if (window.__nbdistDeadAt === null && root.querySelector(sel)) {
      window.__nbdistDeadAt = Date.now();
      obs.disconnect();
    }
  });
  obs.observe(root, {subtree: true, childList: true, attributes: true});
  return root.querySelector(sel) === null;
}"""


# When the page asked for a run's workers (epoch seconds), from the browser's resource timing.
HEALTH_TIMES = """() => performance.getEntriesByType('resource')
  .filter(e => e.name.includes('/nbdist/api/runs/') && e.name.split('?')[0].endsWith('/health'))
  .map(e => (performance.timeOrigin + e.startTime) / 1000)"""


def _health_gaps(page, start: float, end: float | None = None) -> list[float]:
    """Seconds between the panel's successive reads of a run's workers from ``start`` on."""
    ts = [t for t in page.evaluate(HEALTH_TIMES) if t >= start and (end is None or t <= end)]
    return [b - a for a, b in zip(ts, ts[1:], strict=False)]


def test_start_train_kill_and_stop(page, lab, data):
    page.evaluate(
        "performance.clearResourceTimings(); performance.setResourceTimingBufferSize(1e5)"
    )
    panel = sidebar(page)
    panel.get_by_label("number of engines").fill("2")
    panel.get_by_role("button", name="Start cluster").click()
    running = panel.locator('.jp-nbdist-cluster[data-state="running"]')
    running.wait_for(timeout=120_000)
    [rec] = _records(data)
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
        seen: set[str] = set()
        latencies, server_cpu = [], None
        for attempt in range(KILLS):
            victim = _rank_pid(kernel, 1)
            if attempt == 0:
                assert victim == rec["slots"][1]["pid"]
            sent = kernel.submit(TRAIN)
            run_id = _live_run(panel, seen)
            if attempt == 0:
                live_from = time.time()
                server_cpu = _watch_it_train(page, panel, lab)
                live_gaps = _health_gaps(page, live_from, time.time())
            latencies.append(_kill_and_time(page, panel, run_id, victim))
            if attempt == 0:  # the cluster's list catches up: its engine is gone
                running.locator('.jp-nbdist-engine[data-alive="false"]').wait_for(timeout=10_000)
                shot(page, "dead-worker", dark_too=True)
            res = kernel.collect(sent, timeout=120)
            assert res.error is not None and "rank 1" in res.error["evalue"]
        # The fast pace is for live runs only: once the last run ended, once a second again.
        panel.locator(
            f'.jp-nbdist-run[data-run-id="{run_id}"]:not([data-status="running"])'
        ).wait_for()
        idle_from = time.time()
        wait_until(
            lambda: len(_health_gaps(page, idle_from)) >= 3, 15, what="the panel's idle polls"
        )
        idle_gaps = _health_gaps(page, idle_from)
        _note_latencies(latencies, server_cpu, live_gaps, idle_gaps)
        assert statistics.median(latencies) < DEAD_WITHIN, (
            f"a killed rank took {_seconds(latencies)} to show as dead in the sidebar "
            f"(median of {KILLS} kills): the promise is under {DEAD_WITHIN:g} s"
        )
        assert statistics.median(live_gaps) < 0.5, f"a live run was polled every {live_gaps}"
        assert statistics.median(idle_gaps) > 0.75, f"no live run, yet polled every {idle_gaps}"
        kernel.ok("%nbdist stop")
    finally:
        shutdown_kernel(kernel)

    assert running.count() == 1  # detaching the notebook left the cluster running
    cluster_pids += [p.pid for p in psutil.Process(host).children(recursive=True)]  # + new engines
    running.locator(".jp-nbdist-stopButton").click()
    panel.locator(".jp-nbdist-cluster").wait_for(state="detached", timeout=60_000)
    assert_gone(cluster_pids, timeout=30)
    assert not _records(data)
    panel.get_by_text("No cluster yet").wait_for()
    shot(page, "after", dark_too=True)


def _rank_pid(kernel, rank: int) -> int:
    """The pid of the engine that holds ``rank`` now (recovery gives a rank a fresh one)."""
    code = f"from nbdist.notebook import session as _s; print(_s.current().slots[{rank}].pid)"
    return int(kernel.ok(code).stdout.split()[-1])


def _live_run(panel, seen: set[str]) -> str:
    """The id of the run the panel shows live, a new one, once its rank 1 is shown ok."""
    live = panel.locator('.jp-nbdist-run[data-status="running"]')

    def new_run() -> str | None:
        rid = live.get_attribute("data-run-id") if live.count() == 1 else None
        return rid if rid is not None and rid not in seen else None

    run_id = wait_until(new_run, 60, interval=0.1, what="a new live run in the panel")
    seen.add(run_id)
    ok = f'.jp-nbdist-run[data-run-id="{run_id}"] .jp-nbdist-worker[data-rank="1"]'
    panel.locator(ok + '[data-state="ok"]').wait_for(timeout=30_000)
    return run_id


def _watch_it_train(page, panel, lab) -> float:
    """The step advances, both workers and the loss curve show; the server's CPU share
    meanwhile (the sidebar polls a live run quickly)."""
    server = psutil.Process(lab.proc.pid)
    cpu0, t0 = sum(server.cpu_times()[:2]), time.monotonic()
    step = panel.get_by_test_id("nbdist-step")

    def step_now() -> int:
        m = re.match(r"\d+", step.inner_text())
        return int(m.group()) if m else -1

    wait_until(lambda: step_now() >= 0, 60, interval=0.2, what="a first step in the panel")
    first = step_now()
    wait_until(
        lambda: step_now() >= first + 20, 60, interval=0.2, what="the step to advance in the panel"
    )
    workers = panel.locator(".jp-nbdist-worker")
    wait_until(lambda: workers.count() == 2, 30, what="two workers in the grid")
    wait_until(
        lambda: panel.locator(".jp-nbdist-curve polyline").count() == 1, 30, what="the loss curve"
    )
    share = (sum(server.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0)
    shot(page, "live", dark_too=True)
    return share


def _kill_and_time(page, panel, run_id: str, pid: int) -> float:
    """SIGKILL ``pid`` (rank 1 of ``run_id``); seconds until its row in the panel says dead."""
    assert page.evaluate(WATCH_DEAD, [run_id, 1]), "rank 1 shown dead before the kill"
    killed = time.time()
    os.kill(pid, signal.SIGKILL)
    page.wait_for_function("window.__nbdistDeadAt !== null", timeout=30_000)
    return page.evaluate("window.__nbdistDeadAt") / 1000 - killed


def _seconds(values: list[float]) -> str:
    return ", ".join(f"{v:.3f}" for v in values) + " s"


def _note_latencies(
    latencies: list[float], server_cpu: float | None, live: list[float], idle: list[float]
) -> None:
    """Kept with the screenshots, and printed (pytest -s shows it)."""
    note = {
        "kill_to_dead_s": [round(v, 3) for v in latencies],
        "median_s": round(statistics.median(latencies), 3),
        "server_cpu_share_while_live": None if server_cpu is None else round(server_cpu, 3),
        "health_poll_gap_live_s": round(statistics.median(live), 3) if live else None,
        "health_poll_gap_idle_s": round(statistics.median(idle), 3) if idle else None,
    }
    (ARTIFACTS / "sidebar-dead-latency.json").write_text(json.dumps(note, indent=1) + "\n")
    print(f"\nsidebar: kill -> dead {_seconds(latencies)}; {note}")
