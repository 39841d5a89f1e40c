"""Boards with no front end: a notebook run by papermill and by ``jupyter nbconvert --execute``
(real ones, each with its own kernel and a local 2-engine cluster) keeps, in the saved .ipynb,
the final picture of the run's dashboard (SVG) and of the sweep's board (PNG) and no widget
at all (so nothing a renderer could fail to draw, and no widget state in the metadata); no
output is an error; and the kernel sent the boards nothing while the cells ran (the boards'
counters, printed by the notebook). The same run made live (``NBDIST_BOARDS=live``) shows what
those counters count. (Notebook 7 in Chromium: test_front_ends_browser.py.)"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys

import psutil
import pytest
from lab import notebook
from processes import wait_until

WIDGET = "application/vnd.jupyter.widget-view+json"
#: What a widget that failed to draw leaves behind, in any front end or exporter.
WIDGET_ERRORS = ("Error displaying widget", "model not found", "Traceback", "Failed to load")
MARK = "BOARDS "  # the line the notebook prints its boards' counters on

TRAIN = """%%distributed --total 30 --name {name}
import time
for i in range(30):
    nbdist.report(step=i, loss=(nbdist.rank() + 1) / (i + 1), samples=16)
    time.sleep(0.05)
"""
SWEEP = """%%distributed --sweep lr=0.1,0.3 --trial-size 1 --name hsweep
import time
for step in range(10):
    nbdist.report(step=step, loss=lr / (step + 1), samples=8)
    time.sleep(0.03)
"""
KEEP = """from nbdist.notebook.run.observers import dashboard as boards
dash = boards.last().dashboard  # before the sweep's trials become the latest runs
"""
COUNT = """import json
from nbdist.notebook.sweeps import board
d, s = dash, board.last()
print("BOARDS " + json.dumps({"live": d.live, "messages": d.messages, "updates": d.updates,
      "seconds": d.seconds, "sweep_live": s.live, "sweep_messages": s.messages}))
"""
# the same run, made live by NBDIST_BOARDS: what the counters count when a board is drawn
LIVE = """import os
os.environ["NBDIST_BOARDS"] = "live"
try:
    get_ipython().run_cell_magic("distributed", "--total 30 --name live", {body!r})
finally:
    del os.environ["NBDIST_BOARDS"]
d = boards.last().dashboard
print("BOARDS " + json.dumps({{"live": d.live, "messages": d.messages, "seconds": d.seconds}}))
"""


def _notebook(live: bool) -> dict:
    body = TRAIN.format(name="live").split("\n", 1)[1]
    cells = [
        "%load_ext nbdist\n%nbdist start -n 2",
        TRAIN.format(name="headless"),
        KEEP,
        SWEEP,
        COUNT,
        *([LIVE.format(body=body)] if live else []),
        "%nbdist stop",
    ]
    return notebook(cells)


def _start(cmd: list[str], cwd) -> subprocess.Popen:
    """Start ``cmd`` (papermill, nbconvert) in a session of its own."""
    return subprocess.Popen(
        cmd,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen, timeout: float = 240) -> None:
    """Wait for ``proc``: it must succeed, and it and every process it started (the kernel, the
    cluster) must be gone when it returns."""
    what = proc.args[2]
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        out, _ = proc.communicate()
        raise AssertionError(f"{what} did not finish in {timeout} s:\n{out[-3000:]}") from None
    assert proc.returncode == 0, out[-3000:]
    wait_until(lambda: not _left(proc), 30, what=f"{what}'s processes to end")


def _left(proc: subprocess.Popen) -> list[int]:
    """The processes still in ``proc``'s session."""
    return [p.pid for p in psutil.process_iter() if _sid(p.pid) == proc.pid]


def _kill(proc: subprocess.Popen) -> None:
    if _left(proc):
        os.killpg(proc.pid, signal.SIGKILL)  # the group this test started, by its leader's id


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def _outputs(nb: dict, index: int) -> list[dict]:
    return nb["cells"][index]["outputs"]


def _text(output: dict) -> str:
    """Everything an output shows as text (a stream, a traceback, a display's text)."""
    parts = [output.get("text", ""), *output.get("traceback", [])]
    for mime, value in output.get("data", {}).items():
        if mime.startswith("text/"):
            parts.append(value)
    return "".join(_joined(p) for p in parts)


def _joined(value: str | list[str]) -> str:
    """A saved notebook's text: one string, or (as nbformat may keep it) a list of lines."""
    return "".join(value) if isinstance(value, list) else value


def _counters(nb: dict, index: int) -> dict:
    lines = [
        line for o in _outputs(nb, index) for line in _text(o).splitlines() if line.startswith(MARK)
    ]
    assert len(lines) == 1, [_text(o) for o in _outputs(nb, index)]
    return json.loads(lines[0][len(MARK) :])


def _check_saved(nb: dict) -> dict:
    """What every headless run's saved notebook must hold; the boards' counters."""
    outputs = [o for c in nb["cells"] for o in c["outputs"]]
    assert [o for o in outputs if o["output_type"] == "error"] == []
    for o in outputs:
        assert not any(e in _text(o) for e in WIDGET_ERRORS), _text(o)
    # the run's dashboard: one display, no widget, the final picture (and its text line)
    boards = [o for o in _outputs(nb, 1) if o["output_type"] == "display_data"]
    assert len(boards) == 1 and WIDGET not in boards[0]["data"]
    svg = _joined(boards[0]["data"]["image/svg+xml"])
    assert svg.startswith("<svg") and ">loss</text>" in svg and "· ok" in svg
    assert "30 / 30 steps" in svg  # the picture has the run's end, not its start
    assert _joined(boards[0]["data"]["text/plain"]).startswith("nbdist dashboard: ")
    # the sweep's board: the same, a PNG
    sweeps = [o for o in _outputs(nb, 3) if o["output_type"] == "display_data"]
    assert len(sweeps) == 1 and WIDGET not in sweeps[0]["data"]
    assert base64.b64decode(sweeps[0]["data"]["image/png"])[:4] == b"\x89PNG"
    counted = _counters(nb, 4)
    # the kernel noticed that nothing draws the boards: no widget, no message, no work
    assert counted["live"] is False and counted["sweep_live"] is False
    assert counted["messages"] == 0 and counted["sweep_messages"] == 0
    assert counted["seconds"] == 0.0
    assert counted["updates"] >= 3  # the run did ask the board to update, several times
    return counted


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """Both tools, started at once (each its own kernel and cluster): ``{tool: (process,
    folder)}``; whatever is left of them is killed after the module."""
    pytest.importorskip("papermill")
    path = tmp_path_factory.mktemp("headless")
    (path / "plain.ipynb").write_text(json.dumps(_notebook(live=False)))
    (path / "compare.ipynb").write_text(json.dumps(_notebook(live=True)))
    py = [sys.executable, "-m"]
    runs = {
        "papermill": _start(
            [*py, "papermill", "compare.ipynb", "compare-out.ipynb", "--kernel", "python3"], path
        ),
        "nbconvert": _start(
            [*py, "nbconvert", "--to", "notebook", "--execute", "plain.ipynb"]
            + ["--output", "plain-out.ipynb"],
            path,
        ),
    }
    yield {tool: (proc, path) for tool, proc in runs.items()}
    for proc in runs.values():
        _kill(proc)
        proc.communicate()


@pytest.mark.timeout(300)
def test_papermill_keeps_the_pictures_and_sends_the_boards_nothing(executed):
    proc, path = executed["papermill"]
    _finish(proc)
    nb = json.loads((path / "compare-out.ipynb").read_text())
    headless = _check_saved(nb)
    # the same run made live: the widget is there and the kernel sent it its updates
    live = _counters(nb, 5)
    assert live["live"] is True and live["messages"] >= 3 and live["seconds"] > 0
    assert any(WIDGET in o.get("data", {}) for o in _outputs(nb, 5))
    print(f"\nheadless board: {headless}\nlive board: {live}")


@pytest.mark.timeout(300)
def test_nbconvert_execute_keeps_the_pictures_and_no_widget_state(executed):
    proc, path = executed["nbconvert"]
    _finish(proc)
    nb = json.loads((path / "plain-out.ipynb").read_text())
    _check_saved(nb)
    # no widget was made at all: nbclient saved no widget state for renderers to restore
    assert "widgets" not in nb["metadata"]


def test_nbdist_boards_chooses_and_a_bad_value_is_one_line(monkeypatch, capsys):
    from nbdist.notebook.board import widget

    monkeypatch.setenv("NBDIST_BOARDS", "picture")
    assert widget.live() is False
    monkeypatch.setenv("NBDIST_BOARDS", " Live ")
    assert widget.live() is True
    monkeypatch.setenv("NBDIST_BOARDS", "sometimes")  # a board is shown mid-run: a warning
    assert widget.live() is True  # auto, and outside a kernel a person is assumed
    assert widget.live() is True
    assert capsys.readouterr().err.splitlines() == [  # once
        "nbdist: NBDIST_BOARDS='sometimes' is not one of auto, live, picture; "
        "boards follow the front end (auto)"
    ]
