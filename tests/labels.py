"""An imbalanced label set, and the check that a split of it gives every part its share of each
class (the sharding plan's unit tests, and scatter on real engines)."""

from __future__ import annotations

import numpy as np

# An imbalanced label set: 1000 rows, classes of 700, 200, 77, 20 and 3 rows.
IMBALANCED = np.repeat(np.arange(5), [700, 200, 77, 20, 3])


def within_one_per_class(labels: np.ndarray, parts: list[np.ndarray], world: int) -> None:
    """Each part holds each class's rows within one of count / world."""
    for c, count in zip(*np.unique(labels, return_counts=True), strict=True):
        got = [int((p == c).sum()) for p in parts]
        assert all(abs(g - count / world) < 1 for g in got), (c, count, got)
