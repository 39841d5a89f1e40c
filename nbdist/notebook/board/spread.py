"""How a metric spreads over many ranks, for a board that cannot draw a line per rank: the band
about each metric's mean and its outlier ranks. The rule is the run store's side's
(``telemetry.spread``), so the board and the sidebar's run view draw the same band and name the
same outliers; the board folds what the run's observers are told into it.
"""

from __future__ import annotations

from ...telemetry.spread import OUTLIERS, Spread

__all__ = ["OUTLIERS", "Spread"]
