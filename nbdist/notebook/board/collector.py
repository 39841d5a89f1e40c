"""The notebook side of telemetry: engines' batches in, the run's live state out.

``Collector.poll(ranks)`` is called by the cell's supervisor every ~20 ms with its ranks. It pops
nbdist's batches from each rank's ``metadata['data']`` (the client's I/O thread adds them
there; popping means nothing is read twice and nothing is overwritten), folds them into one
``RankState`` per rank, a batch at a time (its records' numbers go to the curves; the rest is
folded once per batch), and reads the tail of each rank's output. Work per poll is
proportional to what arrived, so 64 ranks reporting 20 times a second cost the kernel little.

Each rank's state is judged by ``health.classify`` (a pure function), its output read as lines
by ``lines``. Each attempt of the run (its first, and each after a recovery: the cell runs again)
hands the collector new feeds: a rank whose feed is new begins its attempt afresh
(``RankState.again``), its history kept; a new engine in its place is told as a ``replaced``
event. Every metric the ranks report is folded into ``series`` (per rank and their mean,
bounded). The records are ``telemetry.events``'s: ``Batch`` in; what was folded and nobody has
been told yet (``News``: ``MetricRecord``s, ``RunEvent``s, settled means) out, taken by the run's
watch (``run.observers.watch``) with ``take_news``. The collector calls nobody.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ...config import TelemetryConfig
from ...protocol import CellOutcome
from ...telemetry import events as ev
from ...telemetry.events import Batch, MetricRecord, RunEvent
from ...telemetry.series import RunSeries, metric_values
from .health import RankState, classify, ending, why
from .lines import LOG_LINE, last_lines

_MAX_POINTS = 2000  # points kept per curve (min/max decimated: see telemetry/curves.py)
_RATE_WINDOW = 5.0  # seconds of records behind samples/s and the ETA


class RankFeed(Protocol):
    """A running rank as the collector reads it (the supervisor's ``RankRun``, one per attempt):
    ``metadata`` holds what its engine has sent so far (output, telemetry batches, added by
    ipyparallel's I/O thread); ``outcome``, once known, how its cell ended; ``pid``, its
    engine's."""

    metadata: dict
    outcome: CellOutcome | None
    pid: int


@dataclass
class News:
    """What the collector folded since it was last asked: each rank's records (in arrival
    order), the events it saw or made, and the means it settled (``name, step, value``)."""

    records: list[tuple[int, list[MetricRecord]]] = field(default_factory=list)
    events: list[RunEvent] = field(default_factory=list)
    means: list[tuple[str, float, float]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.records or self.events or self.means)


class Collector:
    """Folds the engines' batches into per-rank state, and keeps what it folded as ``News``
    until ``take_news``. Each rank's latest ``HealthSample`` is its ``RankState.health``."""

    def __init__(
        self,
        ranks: list[int],
        cfg: TelemetryConfig | None = None,
        total: int | None = None,
        clock: Callable[[], float] = time.time,
        started: float | None = None,
    ):
        self.cfg = cfg or TelemetryConfig()
        self.clock = clock
        self.started = clock() if started is None else started  # the run's start, on ``clock``
        self.ranks = {r: RankState(r, log=deque(maxlen=self.cfg.log_lines)) for r in ranks}
        self.total = total
        self.first_step: int | None = None
        self.series = RunSeries(_MAX_POINTS)  # every metric, per rank and the mean over ranks
        self.first_record: float | None = None  # engine time, of the attempt under way
        self.rate_window: deque = deque()  # (engine time, samples) across ranks
        self._window_sum = 0.0  # samples in rate_window
        self.batches = 0
        self.records = 0
        self._news = News()
        self._feeds: dict[int, RankFeed] = {}  # each rank's feed of the attempt under way

    # -- input ------------------------------------------------------------------------------
    def poll(self, ranks: Mapping[int, RankFeed]) -> int:
        """Take what arrived from the supervisor's ranks; return the number of batches read."""
        n = 0
        if any(self._feeds.get(r, rk) is not rk for r, rk in ranks.items()):
            self.first_record = None  # the run's next attempt: samples/s counts from its start
        for r, rk in ranks.items():
            st = self.ranks.get(r)
            if st is None:
                st = self.ranks[r] = RankState(r, log=deque(maxlen=self.cfg.log_lines))
            if self._feeds.get(r) is not rk:
                self._attempt(st, rk)
            md = rk.metadata
            data = md.get("data")
            if data:
                for k in [k for k in list(data) if k.startswith(ev.KEY_PREFIX)]:
                    b = data.pop(k, None)
                    if isinstance(b, Batch) and b.v == ev.VERSION:
                        self.ingest(r, b)
                        n += 1
            self._read_log(st, md.get("stdout") or "")
            out = rk.outcome  # a protocol.CellOutcome once the rank's cell has ended
            if st.outcome is None and out is not None:
                st.outcome, st.error = ending(r, out)
                st.profile = out.profile
        return n

    def _attempt(self, st: RankState, rk: RankFeed) -> None:
        """``rk`` is ``st``'s feed from now on: an attempt begins on it (after the run's first,
        its next: recovery runs the cell again)."""
        first = self._feeds.get(st.rank) is None
        self._feeds[st.rank] = rk
        if first:
            st.pid = st.pid or rk.pid
            return
        if st.again(self.clock(), rk.pid):
            old, new = st.replaced[-1], st.pid
            line = f"a fresh engine (pid {new}) in place of pid {old}"
            self._event("replaced", st.rank, line, {"pid": new, "old_pid": old})

    def ingest(self, rank: int, batch: Batch) -> None:
        """Fold one batch from ``rank`` (the supervisor's rank, which names it) into the state."""
        st = self.ranks.setdefault(rank, RankState(rank, log=deque(maxlen=self.cfg.log_lines)))
        st.last_seen = self.clock()
        self.batches += 1
        recs = batch.metrics
        if recs:
            self._fold(st, recs)
            self._news.records.append((rank, recs))
        h = batch.health
        if h is not None:
            st.health = h
            st.host = h.host or st.host
            st.pid = h.pid or st.pid
        for e in batch.events:
            self._event(e.kind, rank, e.message, e.data or {}, at=e.time)

    def _fold(self, st: RankState, recs: list[MetricRecord]) -> None:
        """One batch's records, folded at once: its counts, samples, pace and latest step and
        loss once per batch (64 ranks reporting 20 times a second send 128 batches a second,
        not 1,280 records to fold one by one); each record's numbers still reach the curves,
        and a non-finite loss is said at its own step."""
        n = len(recs)
        self.records += n
        st.reports += n
        st.last_record = recs[-1][0]
        first_t = recs[0][0]
        if self.first_record is None or first_t < self.first_record:
            self.first_record = first_t
        rank, add = st.rank, self.series.add
        samples, total, lowest, loss = 0.0, 0, None, None
        first = last = None  # the batch's first and last (time, step)
        for rec in recs:
            t, step, value, s, tot, extra = rec
            if s:
                samples += s
            if tot and tot > total:
                total = tot
            if value is not None:
                loss = value
                if st.nonfinite is None and not math.isfinite(value):
                    self._nonfinite(st, step, value)
            if step is not None:
                last = (t, step)
                if first is None:
                    first = last
                if lowest is None or step < lowest:
                    lowest = step
            add(rank, step, metric_values(value, extra))
        if total:
            self.total = max(self.total or 0, int(total))
        if samples:
            st.samples += samples
            self.rate_window.append((recs[-1][0], samples))
            self._window_sum += samples
        if loss is not None:
            st.loss = loss
        if last is not None:
            self._stepped(st, first, last, lowest)

    def _stepped(self, st: RankState, first: tuple, last: tuple, lowest: int) -> None:
        """A batch took ``st`` from step ``first`` to ``last`` ((engine time, step) each): its
        pace (seconds per step, smoothed batch by batch), its progress, the run's first step."""
        if self.first_step is None or lowest < self.first_step:
            self.first_step = lowest
        prev = st._last_step_at or first
        (t0, s0), (t1, s1) = prev, last
        if s1 > s0 and t1 > t0:
            dt = (t1 - t0) / (s1 - s0)
            st.step_time = dt if st.step_time is None else 0.7 * st.step_time + 0.3 * dt
        st._last_step_at = last
        st.step = last[1]
        st.progress.append(last)

    def _nonfinite(self, st: RankState, step: int | None, loss: float) -> None:
        st.nonfinite = "nan" if math.isnan(loss) else "inf"
        at = f" at step {step}" if step is not None else ""
        self._event("nan", st.rank, f"loss is {loss}{at}", {"step": step, "loss": str(loss)})

    def _read_log(self, st: RankState, text: str) -> None:
        """The rank's last complete lines, read from the end of its output: nothing of the
        output is kept but those lines, each at most about ``LOG_LINE`` characters, however
        much the rank prints (the text itself is ipyparallel's, and goes with the cell)."""
        seen = (len(text), text[-64:])
        if seen == st._seen or not st.log.maxlen:
            return
        st._seen = seen
        st.log.clear()
        st.log.extend(last_lines(text, st.log.maxlen, LOG_LINE))

    def _event(
        self, kind: str, rank: int | None, message: str, data: dict, at: float | None = None
    ) -> None:
        self._news.events.append(RunEvent(at or time.time(), kind, rank, message, data or None))

    def take_news(self) -> News:
        """What was folded since the last take (records, events, settled means)."""
        news, self._news = self._news, News()
        return news

    # -- verdicts ---------------------------------------------------------------------------
    def update_states(self) -> None:
        """Classify every rank; report each change of state as an event."""
        now = self.clock()
        for r, state in classify(self.ranks, now, self.started, self.cfg).items():
            st = self.ranks[r]
            if state != st.state:
                old, st.state = st.state, state
                if state == ev.OK:
                    self._event("recovered", r, f"{old} -> ok", {})
                elif state == ev.FAILED:
                    self._event("failed", r, st.error or "its cell raised", {})
                elif state not in (ev.DONE, ev.STOPPED):  # said by the run's own end
                    kind = "died" if state == ev.DEAD else state
                    self._event(kind, r, why(st, state, now), {})

    # -- derived figures --------------------------------------------------------------------
    def done(self) -> int | None:
        """Steps completed by the slowest reporting rank (counting from 1)."""
        steps = [s.step for s in self.ranks.values() if s.step is not None]
        if not steps:
            return None
        return min(steps) + (1 if self.first_step == 0 else 0)

    def samples_per_s(self) -> float | None:
        """Samples per second across ranks over the last few seconds of the attempt's records
        (None before its first)."""
        w = self.rate_window
        if not w or self.first_record is None:
            return None
        end = max(s.last_record or 0 for s in self.ranks.values())
        while w and w[0][0] < max(end - _RATE_WINDOW, self.first_record):
            self._window_sum -= w.popleft()[1]
        span = min(_RATE_WINDOW, end - self.first_record)
        return self._window_sum / span if span > 0.05 else None

    def eta(self) -> float | None:
        """Seconds left, from the slowest rank's recent pace, when the total is known."""
        done = self.done()
        if not self.total or done is None:
            return None
        rates = []
        for s in self.ranks.values():
            if len(s.progress) >= 2:
                (t0, s0), (t1, s1) = s.progress[0], s.progress[-1]
                if t1 > t0 and s1 > s0:
                    rates.append((s1 - s0) / (t1 - t0))
        if not rates:
            return None
        return max(0.0, (self.total - done) / min(rates))

    def settle_mean(self, final: bool = False) -> None:
        """Fold the steps that every live reporting rank has passed (every step, when
        ``final``) into the means (``series.settle``)."""
        live = [
            s.step
            for s in self.ranks.values()
            if s.step is not None and s.state not in (ev.SILENT, ev.DEAD) and s.outcome is None
        ]
        self.series.settle(min(live) if live else math.inf, final=final, into=self._news.means)

    def mean_loss(self) -> float | None:
        """The latest settled mean loss over ranks."""
        return self.series.last("loss")

    def summary(self) -> dict:
        """The run's figures as the run store and the trackers keep them: steps done,
        samples/s, the total when known, the loss (a non-finite one once any rank saw it)."""
        out = {"step": self.done(), "samples_per_s": self.samples_per_s()}
        if self.total:
            out["total"] = self.total
        bad = [st for st in self.ranks.values() if st.nonfinite]
        loss = float(bad[0].nonfinite) if bad else self.mean_loss()
        if loss is not None:
            out["loss"] = loss
        return out
