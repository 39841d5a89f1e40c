"""The quickstart notebook executes end to end and trains to its promised accuracy."""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "quickstart.ipynb"


def test_quickstart_trains_digits_to_90_percent(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    results = [
        out["data"]["text/plain"]
        for cell in nb.cells
        for out in cell.get("outputs", [])
        if out.get("output_type") == "execute_result"
    ]
    summary = next(ast.literal_eval(r) for r in results if "test_accuracy" in r)
    assert summary["identical_parameters"] is True
    assert summary["test_accuracy"] >= 0.90, summary
