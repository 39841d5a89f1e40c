"""Paths a person types (``~/data``, ``~alice/runs``), made ``Path``s, or one line saying why not.

``Path.expanduser`` raises a RuntimeError for ``~name`` when there is no user ``name``: typed
input must not reach the notebook as that traceback.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import UsageError


def expand(path: str | os.PathLike, what: str) -> Path:
    """``path`` with ``~`` expanded; a UsageError naming ``what`` when it cannot be."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        raise UsageError(
            f"{what} {os.fspath(path)!r:.80} starts with '~' but names no user's home: "
            "give the full path"
        ) from None
