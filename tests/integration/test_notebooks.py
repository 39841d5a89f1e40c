"""The example notebooks execute headless in a real kernel and show what they promise."""

from __future__ import annotations

import ast
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


def test_quickstart_trains_digits_to_90_percent(tmp_path):
    texts = _execute("quickstart.ipynb", tmp_path)
    summary = next(ast.literal_eval(t) for t in texts if "test_accuracy" in t)
    assert summary["identical_parameters"] is True
    assert summary["test_accuracy"] >= 0.90, summary
