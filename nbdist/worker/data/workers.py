"""The loaders whose worker processes may be running, so that a failed or stopped cell ends
them: the runner calls ``reclaim()`` when a cell did not end well. A loader's iterator, asked
for more in a later cell, starts new workers where it stood. Imports nothing heavy: the runner
imports it for every cell."""

from __future__ import annotations

import weakref
from typing import Any

_loaders: weakref.WeakSet = weakref.WeakSet()


def register(loader: Any) -> None:
    """Let ``reclaim`` reach ``loader`` (held weakly: a loader forgotten is no concern here)."""
    _loaders.add(loader)


def reclaim() -> None:
    """End the worker processes of every loader's epoch in progress."""
    for loader in list(_loaders):
        loader.reclaim()
