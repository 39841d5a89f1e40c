"""When a sweep stops a trial early: each trial's loss history, and the median rule over them.

A trial's ``LossHistory`` is what the rule and the trials table read of its main rank's losses:
the latest, the best, and the mean up to any step. It costs the same at the millionth report as
at the tenth: running sums kept at a bounded number of evenly spaced steps (past ``limit``,
every other one is dropped and the spacing doubles, as the curves thin out), so "the mean up to
step s" is the mean up to the nearest kept step at or before s, within 2/``limit`` of the run;
the latest mean is exact. A trial that
goes back to an earlier step (a restart from a checkpoint) replaces what it reported past it.
"""

from __future__ import annotations

import bisect
import statistics

_KEPT = 4096  # steps whose running sums a history keeps


class LossHistory:
    """One trial's losses, in the order its main rank reported them (see the module's text)."""

    def __init__(self, limit: int = _KEPT):
        self.limit = limit
        self.reports = 0  # every loss added, a restart's again included
        self.last: float | None = None
        self.last_step: int | None = None
        self.best: float | None = None
        self._steps: list[int] = []  # increasing
        self._sums: list[tuple[float, int]] = []  # (sum, count) of the losses up to each
        self._stride = 1  # steps between kept ones (but the latest)

    def add(self, step: int, loss: float) -> None:
        """The loss at ``step``."""
        self.reports += 1
        self.last, self.last_step = loss, step
        self.best = loss if self.best is None else min(self.best, loss)
        while self._steps and self._steps[-1] >= step:  # back to an earlier step: replaced
            self._steps.pop()
            self._sums.pop()
        total, count = self._sums[-1] if self._sums else (0.0, 0)
        steps = self._steps
        if len(steps) >= 2 and steps[-1] - steps[-2] < self._stride:  # the latest moves on
            steps[-1], self._sums[-1] = step, (total + loss, count + 1)
            return
        steps.append(step)
        self._sums.append((total + loss, count + 1))
        if len(steps) > self.limit:  # every other one, the latest kept; twice as far apart
            self._steps, self._sums = steps[-1::-2][::-1], self._sums[-1::-2][::-1]
            self._stride *= 2

    def mean_to(self, step: int) -> float | None:
        """The mean of the losses up to ``step`` (None: none that early)."""
        i = bisect.bisect_right(self._steps, step) - 1
        if i < 0:
            return None
        total, count = self._sums[i]
        return total / count

    def __len__(self) -> int:
        return len(self._steps)


def median_rule(history: LossHistory, others: list[LossHistory], grace: int) -> str | None:
    """The median stopping rule (``--stop-early median``): why to stop the trial of ``history``
    now, or None. It is stopped when the mean of its losses up to its latest step is worse than
    the median of the same mean of the other trials (``others``) that reached that step, at
    least two of them, after ``grace`` reports."""
    step = history.last_step
    if history.reports < grace or step is None:
        return None
    mine = history.mean_to(step)
    peers = [
        m
        for o in others
        if o.last_step is not None and o.last_step >= step and (m := o.mean_to(step)) is not None
    ]
    if mine is None or len(peers) < 2:
        return None
    median = statistics.median(peers)
    if mine <= median:
        return None
    return (
        f"stopped at step {step}: mean loss {mine:.4g}, worse than the median {median:.4g} "
        f"of {len(peers)} other trials"
    )
