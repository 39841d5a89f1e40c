"""The browser's time to draw a frame of the live board at 256 ranks, against 8 ranks, measured
from Chromium's performance timeline.

A real JupyterLab (``tests/lab.py``) in Debian's headless Chromium (never a downloaded one)
opens a notebook whose one cell feeds the real run's watch (``run.observers.assembly``: the run
store, the health rows, the ``Board`` observer and its ``Dashboard`` widget, drawn by the real
front end) with ``ranks`` simulated ranks, each reporting loss, acc and lr ``HZ`` times a
second (one of them an outlier): the board at 256 ranks draws the mean, the band and the
outlier, and a health grid of 256 cells, as it would for a real cluster; no engine runs (256
engines do not fit this machine beside the browser), so the feed is the ranks' batches handed
to the watch as the supervisor hands them. While the board is live and on screen, the page
records every ``requestAnimationFrame`` time (a frame's interval: what the person sees) and
the ``longtask`` entries (over 50 ms on the main thread), and CDP's ``Performance.getMetrics``
gives the main thread's busy time (``TaskDuration``) over the window.

``frame_figures(ranks, window)`` returns the figures (``bench_scale`` may call it);
``run(tiny)`` compares 256 ranks with 8 (tiny: 32 with 2, briefly).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from . import Result
from ._kernel import ROOT

HZ = 20  # each rank's reports a second
_FEED_LIMIT = 300.0  # seconds the feed runs at most, if nobody tells it to stop
_VIEWPORT = {"width": 1280, "height": 1300}  # the whole board on screen: charts, grid, events

# The cell: the run's real watch fed by simulated ranks until the stop file appears.
_FEED = """
import os, time
from types import SimpleNamespace
from nbdist.config import CellOptions
from nbdist.notebook.run.observers.assembly import assemble
from nbdist.notebook.run.observers.base import Phase
from nbdist.telemetry import events as ev
from nbdist.telemetry.events import Batch, HealthSample, MetricRecord

N, HZ, STOP, LIMIT = {ranks}, {hz}, {stop!r}, {limit}
w = assemble("nbdist.report(step=s, loss=..., acc=..., lr=...)",
             CellOptions(name="board-frame-{ranks}"), list(range(N)))
w.on_phase(Phase.STARTING, Phase.RUNNING)
feeds = {{r: SimpleNamespace(metadata={{"data": {{}}, "stdout": ""}}, outcome=None, pid=40000 + r)
         for r in range(N)}}
t0, s, seq = time.time(), 0, 0
while not os.path.exists(STOP) and time.time() - t0 < LIMIT:
    now = time.time()
    for r, feed in feeds.items():
        seq += 1
        loss = 2.0 / (1 + 0.05 * s) + 0.002 * r + (0.8 if r == N // 3 else 0.0)
        extra = {{"acc": min(1.0, 0.3 + s / 2000 + 0.0005 * r), "lr": 1e-3 / (1 + s / 500)}}
        rec = MetricRecord(now, s, loss, 32, None, extra)
        batch = Batch(r, seq, now, [rec], HealthSample(now, f"h{{r // 8}}", feed.pid, cpu=90.0))
        feed.metadata["data"][ev.key(feed.pid, seq)] = batch
    w.poll(feeds)
    s += 1
    time.sleep(max(0.0, t0 + s / HZ - time.time()))
w.close("ok")
print(f"fed {{N}} ranks {{s}} steps in {{time.time() - t0:.1f}} s")
"""

# In the page: every animation frame's time, and the long tasks, from now on.
_RECORD = """() => {
  const m = (window.__nbdFrames = { frames: [], long: [] });
  new PerformanceObserver(list => {
    for (const e of list.getEntries()) m.long.push([e.startTime, e.duration]);
  }).observe({ type: 'longtask' });
  const loop = t => { m.frames.push(t); requestAnimationFrame(loop); };
  requestAnimationFrame(loop);
}"""
_NOW = "() => performance.now()"
_TAKE = "([a, b]) => { const m = window.__nbdFrames; return { frames: m.frames.filter(t => t >= a" \
    " && t <= b), long: m.long.filter(([t]) => t >= a && t <= b) }; }"  # fmt: skip


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def _busy(cdp) -> float:
    """The renderer main thread's busy seconds so far (CDP ``TaskDuration``)."""
    got = cdp.send("Performance.getMetrics")["metrics"]
    return next(m["value"] for m in got if m["name"] == "TaskDuration")


def _say(what: str) -> None:
    """Where the benchmark is (on stderr: the harness shows it when one fails)."""
    print(f"{time.strftime('%H:%M:%S')} board_frame: {what}", file=sys.stderr, flush=True)


def _one(lab, page, cdp, root: Path, ranks: int, window: float, shots: Path | None) -> dict:
    """The board of ``ranks`` live in ``page``: its frames over ``window`` seconds (and its
    picture, as it was then, in ``shots``)."""
    _say(f"{ranks} ranks: opening the notebook")
    stop = root / f"stop-{ranks}"
    name = f"board-{ranks}.ipynb"
    from lab import notebook

    cell = _FEED.format(ranks=ranks, hz=HZ, stop=str(stop), limit=_FEED_LIMIT)
    (root / name).write_text(json.dumps(notebook([cell])))
    page.goto(lab.page_url(f"lab/tree/{name}") + "&reset")  # this notebook alone open
    page.wait_for_selector(".jp-Notebook")
    page.wait_for_function(
        "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
        " return w && w.sessionContext && w.sessionContext.session"
        " && w.sessionContext.session.kernel; }"
    )
    page.evaluate(_RECORD)
    _say(f"{ranks} ranks: its kernel is up, running the feed")
    # not awaited: its promise ends with the cell
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    board = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .nbd-dashboard").first
    # live: every rank's row in, the loss charted (a band past 8 ranks)
    page.wait_for_function(
        "n => { const b = window.jupyterapp.shell.currentWidget.node"
        ".querySelector('.nbd-dashboard');"
        " return b && b.dataset.ranks === String(n) && b.dataset.status === 'running'"
        " && b.querySelector(\".nbdist-chart[data-metric='loss'] canvas\"); }",
        arg=ranks,
        timeout=120_000,
    )
    _say(f"{ranks} ranks: the board is live, measuring")
    board.scroll_into_view_if_needed()
    page.wait_for_timeout(2000)  # past the first history's drawing: the steady state is measured
    a, busy0, t0 = page.evaluate(_NOW), _busy(cdp), time.monotonic()
    page.wait_for_timeout(window * 1000)
    b, busy1, wall = page.evaluate(_NOW), _busy(cdp), time.monotonic() - t0
    got = page.evaluate(_TAKE, [a, b])
    title = board.locator(".nbdist-chart[data-metric='loss'] .nbdist-chart-title").inner_text()
    if shots is not None:
        board.screenshot(path=str(shots / f"board-frame-{ranks}.png"))
    stop.write_text("")
    _say(f"{ranks} ranks: measured, stopping the feed")
    out = page.locator(".jp-OutputArea-output", has_text="fed ").first
    out.wait_for(timeout=120_000)
    fed = out.inner_text().strip()
    for kernel in lab.api("api/kernels"):  # nothing of this board's left running for the next
        lab.api(f"api/kernels/{kernel['id']}", method="DELETE")
    deltas = [y - x for x, y in zip(got["frames"], got["frames"][1:], strict=False)]
    long_ms = [d for _, d in got["long"]]
    return {
        "ranks": ranks,
        "seconds": (b - a) / 1000,
        "frames_per_s": len(deltas) / ((b - a) / 1000),
        "frame_ms_median": statistics.median(deltas) if deltas else float("nan"),
        "frame_ms_p95": _quantile(deltas, 0.95),
        "frame_ms_max": max(deltas, default=float("nan")),
        "long_tasks": len(long_ms),
        "long_task_ms_total": sum(long_ms),
        "long_task_ms_max": max(long_ms, default=0.0),
        "busy_share": (busy1 - busy0) / wall,
        "title": title,
        "fed": fed,
    }


def _stop_at(deadline: float, proc) -> threading.Timer:
    """The lab (its own session: the harness's kill at its timeout would miss it) and its
    kernels killed ``deadline`` seconds from now, so that a board that never comes fails the
    benchmark in time and leaves nothing running."""
    import psutil

    def kill() -> None:
        try:
            procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        _say(f"past its {deadline:.0f} s: the lab and its kernels stopped")
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()

    timer = threading.Timer(deadline, kill)
    timer.daemon = True
    timer.start()
    return timer


def frame_figures(
    ranks: tuple[int, ...] = (8, 256),
    window: float = 15.0,
    deadline: float = 900.0,
    shots: Path | None = None,
) -> dict[int, dict]:
    """Each board of ``ranks`` measured in turn, in one JupyterLab and one Chromium: ``{ranks:
    {frames_per_s, frame_ms_median, frame_ms_p95, frame_ms_max, long_tasks,
    long_task_ms_total, long_task_ms_max, busy_share (of the page's main thread), title (the
    loss chart's), fed (what the feed did)}}``. Past ``deadline`` seconds the lab is stopped
    (and the benchmark fails). ``shots``: a folder for each board's screenshot."""
    sys.path.insert(0, str(ROOT / "tests"))
    from lab import CHROMIUM, FLAGS, running_lab
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        raise RuntimeError(f"{CHROMIUM} is absent: run scripts/install-system-deps.sh")
    out = {}
    with tempfile.TemporaryDirectory(prefix="nbdist-frame-") as tmp:
        base, root = Path(tmp), Path(tmp) / "root"
        with running_lab(base, root, env={"NBDIST_DATA_DIR": str(base / "data")}) as lab:
            timer = _stop_at(deadline, lab.proc)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
                try:
                    page = browser.new_page(viewport=_VIEWPORT)
                    page.set_default_timeout(60_000)
                    cdp = page.context.new_cdp_session(page)
                    cdp.send("Performance.enable")
                    for n in ranks:
                        out[n] = _one(lab, page, cdp, root, n, window, shots)
                finally:
                    timer.cancel()
                    browser.close()
    return out


def run(tiny: bool = False) -> list[Result]:
    big, small = (32, 2) if tiny else (256, 8)
    try:
        got = frame_figures((small, big), 3.0 if tiny else 15.0, 200.0 if tiny else 900.0)
    except Exception as e:  # no browser here, or the lab would not start: one row saying so
        note = f"n/a: {type(e).__name__}: {e}"[:120]
        return [Result(f"board frame p95, {big} ranks / {small}", float("nan"), 1.0, "ms",
                       note=note)]  # fmt: skip
    s, b = got[small], got[big]
    vs = f"{big} ranks / {small}"
    note = (
        f"(JupyterLab in headless Chromium, a {big}-rank feed of simulated ranks into the real "
        f"Board observer and widget, {HZ} reports/s each; long tasks {b['long_tasks']} "
        f"({b['long_task_ms_total']:.0f} ms, longest {b['long_task_ms_max']:.0f}) vs "
        f"{s['long_tasks']} ({s['long_task_ms_total']:.0f} ms) in {b['seconds']:.0f} s; "
        f"longest frame {b['frame_ms_max']:.0f} vs {s['frame_ms_max']:.0f} ms; "
        f"{b['fed']} | {s['fed']}; drawn: '{b['title']}')"
    )
    return [
        Result(f"board frames/s, {vs}", b["frames_per_s"], s["frames_per_s"], "frames/s"),
        Result(f"board frame median, {vs}", b["frame_ms_median"], s["frame_ms_median"], "ms"),
        Result(f"board frame p95, {vs}", b["frame_ms_p95"], s["frame_ms_p95"], "ms"),
        Result(
            f"board page main thread busy, {vs}",
            100 * b["busy_share"],
            100 * s["busy_share"],
            "%",
            note=note,
        ),  # fmt: skip
    ]


if __name__ == "__main__":  # the figures in full, and each board's screenshot in /tmp
    for n, figures in frame_figures(shots=Path(tempfile.gettempdir())).items():
        print(n, json.dumps(figures, indent=1))
