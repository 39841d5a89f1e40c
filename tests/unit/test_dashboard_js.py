"""The browser and the kernel agree: the board's built ES module, run by node, keeps the same
points of a curve as ``telemetry.curves.Curve`` and writes numbers and durations as
``telemetry.format`` does (the sidebar and both boards use the same ``format.ts``)."""

from __future__ import annotations

import json
import random
import shutil
import subprocess

import pytest

from nbdist.notebook.board import widget
from nbdist.telemetry import format as fmt
from nbdist.telemetry.curves import Curve

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")


def _node(tmp_path, body: str, stdin: str = "") -> dict:
    """Run ``body`` (JavaScript, with ``m``: the dashboard's module) and parse what it prints."""
    module = tmp_path / "dashboard.mjs"
    module.write_text(widget.built("dashboard.js"))
    script = f"import({json.dumps(module.as_uri())}).then(m => {{ {body} }});"
    out = subprocess.run(
        ["node", "-e", script], input=stdin, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_browser_and_kernel_keep_the_same_points(tmp_path):
    rng = random.Random(1)
    ys = [rng.gauss(0, 1) for _ in range(30_000)]
    ys[12_345] = 40.0
    curve = Curve(2000)
    for i, y in enumerate(ys):
        curve.add(i, y)
    js = _node(
        tmp_path,
        "const ys = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
        "const s = new m.Series();"
        "ys.forEach((y, i) => s.push(i, y));"
        "const v = s.view();"
        "console.log(JSON.stringify({x: v.x, y: v.y, stride: s.stride}));",
        json.dumps(ys),
    )
    assert js["stride"] == curve.stride
    assert js["x"] == curve.x and js["y"] == pytest.approx(curve.y)
    assert max(js["y"]) == 40.0


NUMBERS = [0.001658, 2.9e-4, 1234.56, 12.345, 0.5, 100, 123456, 1e6, -0.25, 0, 3079, 7.21]
SECONDS = [7.3, 0.04, 59.91, 60, 125, 3599.2, 3600, 3725, 86400]


def test_numbers_and_durations_read_the_same_in_the_browser_and_the_kernel(tmp_path):
    js = _node(
        tmp_path,
        f"const ns = {json.dumps(NUMBERS)}, ss = {json.dumps(SECONDS)};"
        "console.log(JSON.stringify({fmt: ns.map(v => m.fmt(v)), int: ns.map(v => m.fmtInt(v)),"
        " dur: ss.map(s => m.fmtDuration(s)),"
        " col: [0.001658, 2.9e-4, 0.5].map(m.columnFormat([0.001658, 2.9e-4, 0.5]))}));",
    )
    assert js["fmt"] == [fmt.fmt(v) for v in NUMBERS]
    assert js["int"] == [fmt.fmt_int(v) for v in NUMBERS]
    assert js["dur"] == [fmt.fmt_duration(s) for s in SECONDS]
    assert js["dur"][:5] == ["7.3 s", "0.0 s", "59.9 s", "1 min 00 s", "2 min 05 s"]
    assert js["fmt"][6] == "123,500" and js["int"][10] == "3,079"
    # one format per column: never 0.001658 beside 2.90e-4
    assert js["col"] == ["1.66e-3", "2.90e-4", "5.00e-1"]


def test_the_browser_keeps_the_same_events_in_view_as_the_kernel(tmp_path):
    """A recovery's events stay in view in the browser as in the kernel's history and picture:
    the latest ordinary events, and beside them those that tell a failure or a recovery, however
    many ordinary ones came after (``shown.in_view`` and the board's ``inView``)."""
    from nbdist.notebook.board.shown import event_dict, in_view
    from nbdist.telemetry.events import RunEvent

    rng = random.Random(2)
    kinds = ["checkpoint", "sync", "slow", "recovered", "died", "failure", "phase", "restart"]
    events = [RunEvent(float(i), rng.choice(kinds), rng.choice([None, 0, 1]), f"e{i}", None)
              for i in range(400)]  # fmt: skip
    sent = [event_dict(e) for e in events]
    js = _node(
        tmp_path,
        "const es = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
        "console.log(JSON.stringify([8, 50].map(n => m.inView(es, n).map(e => e.message))));",
        json.dumps(sent),
    )
    kept = [e.message for e in events if e.kind in ("died", "failure", "phase", "restart")]
    for latest, shown in zip([8, 50], js, strict=True):
        assert shown == [e.message for e in in_view(events, latest)]
        assert len(shown) == latest + 24 and [m for m in shown if m in kept] == kept[-24:]
        assert shown[-1] == events[-1].message


def test_no_samples_per_second_is_drawn_across_the_time_spent_recovering(tmp_path):
    """The samples/s line as the board draws it: no point inside a band, and a point with no
    value at each band's edges, so the line stops at the band and starts again after it."""
    js = _node(
        tmp_path,
        "const line = {x: [1, 2, 3, 4, 9, 10], y: [5, 6, 7, 8, 9, 10]};"
        "const bands = [{from: 3, to: 8.5, label: 'recovering', colour: 'red'},"
        " {from: 10.5, to: 12, label: 'recovering', colour: 'red'}];"
        "console.log(JSON.stringify(m.broken(line, bands)));",
    )
    assert js == {
        "x": [1, 2, 3, 8.5, 9, 10, 10.5, 12],
        "y": [5, 6, None, None, 9, 10, None, None],
    }


def test_the_readout_reads_each_lines_own_stored_points(tmp_path):
    """Decimated lines do not share every step: at step 299 rank 0 kept 298 and 299, rank 1 kept
    297 only. The readout reads each line's own nearest point and says its step (never another
    step's value as this step's, as it did through the joined table's neighbours); smoothed lines
    keep their raw values beside them."""
    js = _node(
        tmp_path,
        "const ranks = [{rank: 0, x: [296, 298, 299], y: [3, 2e-7, 2.997e-6]},"
        " {rank: 1, x: [295, 297], y: [5, 2.5e-6]}];"
        "const mean = {x: [295, 296, 297, 298, 299], y: [5, 3, 2.5e-6, 2e-7, 2.997e-6]};"
        "const plain = m.rankLines(ranks, mean, 0), smooth = m.rankLines(ranks, mean, 0.6);"
        "console.log(JSON.stringify({at299: m.readings(plain, 299), at298: m.readings(plain, 298),"
        " smooth: m.readings(smooth, 299)}));",
    )
    assert js["at299"] == [
        {"label": "rank 0", "x": 299, "y": 2.997e-6, "raw": 2.997e-6},
        {"label": "rank 1", "x": 297, "y": 2.5e-6, "raw": 2.5e-6},
        {"label": "mean", "x": 299, "y": 2.997e-6, "raw": 2.997e-6},
    ]
    assert [(r["label"], r["x"], r["y"]) for r in js["at298"]] == [
        ("rank 0", 298, 2e-7), ("rank 1", 297, 2.5e-6), ("mean", 298, 2e-7)
    ]  # fmt: skip
    raw = [(r["label"], r["x"], r["raw"]) for r in js["smooth"]]
    assert raw == [("rank 0", 299, 2.997e-6), ("rank 1", 297, 2.5e-6), ("mean", 299, 2.997e-6)]
    assert all(r["y"] != r["raw"] for r in js["smooth"])  # the smoothed value, and the raw one


def test_one_number_format_per_metric_whatever_the_smoothing(tmp_path):
    """A metric's format on a board: chosen from its raw values, kept in the exponent form once
    any value needed it (0.006316 is not written so beside 5.72e-3, nor after it)."""
    js = _node(
        tmp_path,
        "const f = new m.MetricFormats();"
        "const a = f.of('loss', [0.5, 0.006316]), b = f.of('loss', [0.006316, 5.72e-4]),"
        " c = f.of('loss', [0.006316]), d = f.of('acc', [0.9375, 0.875]);"
        "console.log(JSON.stringify([a(0.006316), b(0.006316), c(0.006316), d(0.9375),"
        " b === c]));",
    )
    assert js == ["0.006316", "6.32e-3", "6.32e-3", "0.9375", True]
