"""What the notebook knows of one rank while a run goes (``RankState``), and the health verdict
on it, a pure function: ok, slow (a straggler), silent while the cell runs; then done, failed
(its own code raised), stopped (by a peer's failure, an interrupt, a timeout) or dead.

A run may take several attempts (recovery runs the cell again): what a rank did in all of them
is its history (steps, samples, curves, pids); how its current attempt goes (its outcome, when it
was last heard from, its latest report) is judged from the attempt's start (``since``)."""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from ...config import TelemetryConfig
from ...errors import RankFailure
from ...protocol import CellOutcome, ProfileResult
from ...telemetry import events as ev
from ...telemetry.events import HealthSample


@dataclass
class RankState:
    """What the notebook knows about one rank during a run."""

    rank: int
    host: str = ""
    pid: int | None = None
    replaced: list[int] = field(default_factory=list)  # the pids of its earlier engines
    step: int | None = None
    loss: float | None = None
    samples: float = 0.0  # samples reported so far
    reports: int = 0
    last_record: float | None = None  # engine time of its attempt's latest metric record
    last_seen: float | None = None  # notebook time of its attempt's latest batch (the heartbeat)
    since: float | None = None  # notebook time its attempt began (None: at the run's start)
    step_time: float | None = None  # smoothed seconds per step
    health: HealthSample | None = None  # the latest sample
    state: str = ev.OK
    outcome: str | None = None  # None while running; then done | failed | stopped | dead
    error: str | None = None  # a failed rank's error, one line
    profile: ProfileResult | None = None  # what torch.profiler saw, for a cell under --profile
    nonfinite: str | None = None  # "nan" / "inf" once a non-finite loss was seen
    progress: deque = field(default_factory=lambda: deque(maxlen=64))  # (engine time, step)
    log: deque = field(default_factory=lambda: deque(maxlen=5))
    _seen: tuple = (0, "")  # the rank's stdout as last read: its length and its end
    _last_step_at: tuple | None = None  # (engine time, step) of the previous record

    def again(self, now: float, pid: int | None) -> bool:
        """The run's next attempt begins on this rank (recovery runs the cell again), on the
        engine ``pid``: how its last attempt ended and when it was last heard from are
        forgotten; what it did (steps, samples, curves, log) is kept. Whether ``pid`` is a
        fresh engine in place of a lost one (the old pid is kept in ``replaced``)."""
        self.outcome = self.error = self.profile = None
        self.state = ev.OK
        self.last_seen = self.last_record = self._last_step_at = None
        self.since = now
        self.progress.clear()
        self._seen = (0, "")
        fresh = pid is not None and self.pid is not None and pid != self.pid
        if fresh:
            self.replaced.append(self.pid)
        self.pid = pid or self.pid
        return fresh


def classify(
    ranks: dict[int, RankState], now: float, started: float, cfg: TelemetryConfig
) -> dict[int, str]:
    """Each rank's state: how it ended (``RankState.outcome``), or while it runs silent (no
    news), slow (a straggler) or ok.

    Silent: no batch at all for ``silent_after`` s (the engine is stuck or unreachable); or,
    while other ranks report, no report of its own for ``max(silent_after, 10 x median step)``.
    Slow: a smoothed step time above ``slow_factor`` times the median of the running ranks.
    Both count from the rank's attempt (``since``; ``started``, the run's start, for the first).
    """
    running = [r for r in ranks.values() if r.outcome is None]
    times = [r.step_time for r in running if r.step_time]
    median = statistics.median(times) if len(times) >= 2 else None
    reporting = any(r.last_record is not None for r in ranks.values())  # in this attempt
    quiet_limit = max(cfg.silent_after, 10 * median) if median else cfg.silent_after
    out = {}
    for r in ranks.values():
        began = started if r.since is None else r.since
        if r.outcome is not None:
            out[r.rank] = r.outcome
        elif now - (r.last_seen or began) > cfg.silent_after:
            out[r.rank] = ev.SILENT
        elif reporting and quiet_for(r, now, began) > quiet_limit:
            out[r.rank] = ev.SILENT
        elif median and r.step_time and r.step_time > cfg.slow_factor * median:
            out[r.rank] = ev.SLOW
        else:
            out[r.rank] = ev.OK
    return out


def quiet_for(r: RankState, now: float, started: float) -> float:
    """Seconds since this rank's last report, measured on its own clock when possible."""
    h = r.health
    if r.last_record is not None and h is not None and h.time:
        return max(0.0, h.time - r.last_record) + (now - (r.last_seen or now))
    return now - started if r.last_record is None else 0.0


def ending(rank: int, out: CellOutcome) -> tuple[str, str | None]:
    """How a rank's cell ended, as its final state and (when it failed by itself) its error:
    a rank that stopped because a peer failed, or was interrupted, is stopped, not failed."""
    if out.ok:
        return ev.DONE, None
    if out.kind in ("died", "hung"):
        return ev.DEAD, out.summary or None
    if out.kind in ("interrupted", "timeout") or RankFailure(rank, out.summary).bystander:
        return ev.STOPPED, None
    return ev.FAILED, out.summary or None


def why(st: RankState, state: str, now: float) -> str:
    """Why ``st`` reads ``state``, in a few words (the event the board lists)."""
    if state == ev.DEAD:
        return "its engine is gone"
    if state == ev.SILENT:
        if st.last_seen is None or now - st.last_seen > 3:
            return "no heartbeat"
        return "no report() lately"
    if state == ev.SLOW and st.step_time:
        return f"step time {st.step_time * 1000:.0f} ms, well above the others'"
    return state
