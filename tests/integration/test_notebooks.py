"""The example notebooks execute headless in a real kernel and show what they promise."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).parents[2] / "notebooks"


def _execute(name: str, tmp_path) -> list[str]:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    texts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            texts.append(out.get("text") or out.get("data", {}).get("text/plain", ""))
    return texts


def test_fault_tolerance_notebook_recovers_on_its_own(tmp_path):
    texts = _execute("fault_tolerance.ipynb", tmp_path)
    joined = "\n".join(texts)
    assert "resumed at step " in joined
    assert "nbdist: recovered 1 time(s)" in joined
    assert "True" in [t.strip() for t in texts]  # the same parameters as the uninterrupted run


def test_quickstart_runs_the_whole_mission(tmp_path, monkeypatch):
    data = tmp_path / "data"
    monkeypatch.setenv("NBDIST_DATA_DIR", str(data))  # the kernel and its engines write here
    texts = _execute("quickstart.ipynb", tmp_path)
    joined = "\n".join(texts)

    # the shard report: stratified, every class within one sample between the two ranks
    assert "'train' scattered to 2 ranks" in joined and "stratified" in joined
    lines = joined.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("rank") and "label" in line)
    rank0, rank1 = ([int(c) for c in lines[head + r].split()[2:]] for r in (1, 2))
    assert len(rank0) == len(rank1) == 10
    assert all(abs(a - b) <= 1 for a, b in zip(rank0, rank1, strict=True)), (rank0, rank1)

    # trained in sync, accurate on the engines and in the notebook with the pulled model
    summary = next(ast.literal_eval(t) for t in texts if "test_accuracy" in t)
    assert summary["identical_parameters"] is True
    assert summary["test_accuracy"] >= 0.95, summary
    pulled = re.search(r"test accuracy of the pulled model: ([\d.]+)", joined)
    assert pulled, joined
    assert abs(float(pulled.group(1)) - summary["test_accuracy"]) < 0.005

    # the named run is kept, with its checkpoints, which are on disk
    assert re.search(r"run \d+ 'quickstart': ok, \d+ metric rows", joined), joined
    assert "checkpoint of step 400 written" in joined
    written = {p.name for p in data.glob("checkpoints/*/step-*.json")}
    assert "step-00000400.json" in written, written
