"""Notebook-side functions that act on the current cluster."""

from __future__ import annotations

from typing import Any

from . import session


def pull(name: str, rank: int = 0) -> Any:
    """Bring the engine variable ``name`` from ``rank`` (default 0) into the notebook."""
    return session.current().pull(name, rank=rank)
