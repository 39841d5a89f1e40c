"""The browser decimates curves by the same rule as the kernel: the same points in, the same
points kept (the dashboard's ES module run by node, against ``notebook.board.curves.Curve``)."""

from __future__ import annotations

import json
import random
import shutil
import subprocess

import pytest

from nbdist.notebook.board import widget
from nbdist.notebook.board.curves import Curve


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_browser_and_kernel_keep_the_same_points(tmp_path):
    """One Series (static/common.js) serves both boards: the dashboard's module exports it."""
    module = tmp_path / "dashboard.mjs"
    module.write_text(widget.module("dashboard.js"))
    rng = random.Random(1)
    ys = [rng.gauss(0, 1) for _ in range(30_000)]
    ys[12_345] = 40.0
    curve = Curve(2000)
    for i, y in enumerate(ys):
        curve.add(i, y)
    script = (
        f"import({json.dumps(module.as_uri())}).then(m => {{"
        "  const ys = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
        "  const s = new m.Series();"
        "  ys.forEach((y, i) => s.push(i, y));"
        "  const v = s.view();"
        "  console.log(JSON.stringify({x: v.x, y: v.y, stride: s.stride}));"
        "});"
    )
    out = subprocess.run(
        ["node", "-e", script], input=json.dumps(ys), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    js = json.loads(out.stdout)
    assert js["stride"] == curve.stride
    assert js["x"] == curve.x and js["y"] == pytest.approx(curve.y)
    assert max(js["y"]) == 40.0
