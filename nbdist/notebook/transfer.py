"""Values from engines, unpacked in the notebook's main thread (see ``worker.runner.portable``)."""

from __future__ import annotations

import pickle
from typing import Any


class EngineValue:
    """Stands in for an engine value that could not travel: shows its repr, as plain text."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def unpack(packed: dict | None) -> Any:
    """The value itself where it can be rebuilt here, else an ``EngineValue`` with its repr."""
    if packed is None:
        return None
    if "pickle" in packed:
        try:
            return pickle.loads(packed["pickle"])
        except Exception:
            pass
    return EngineValue(packed["repr"])
