"""Where the tests find things, whatever folder a test stands in: the repository (``ROOT``),
what the tests leave for the docs (``ARTIFACTS``: executed notebooks, screenshots), and the
nbdist data folder a test sets (``data_dir_env``)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"


@contextlib.contextmanager
def data_dir_env(path):
    """``NBDIST_DATA_DIR`` set to ``path`` (for this process and what it starts), then restored."""
    old = os.environ.get("NBDIST_DATA_DIR")
    os.environ["NBDIST_DATA_DIR"] = str(path)
    try:
        yield path
    finally:
        if old is None:
            os.environ.pop("NBDIST_DATA_DIR", None)
        else:
            os.environ["NBDIST_DATA_DIR"] = old
