"""``--stop-on-nan``: the first loss that is not finite, on any rank, stops every rank; the cell
fails with that rank's loss as its cause (the collector flags it as a ``nan`` event at once)."""

from __future__ import annotations

from ....errors import RankFailure
from ....telemetry.events import RunEvent
from .base import Observer, Stop


class StopOnNan(Observer):
    """Asks ``stop`` to end the run at its first non-finite loss."""

    def __init__(self, stop: Stop):
        self.stop = stop

    def on_event(self, event: RunEvent) -> None:
        if event.kind == "nan" and event.rank is not None:
            why = f"loss is not finite: {event.message} (stopped by --stop-on-nan)"
            failure = RankFailure(event.rank, why, at=event.time, kind="error")
            self.stop.request(failure, "stopped by --stop-on-nan")
