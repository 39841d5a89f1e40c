"""How far the ranks drifted apart before a sync, and the ``sync`` events rank 0 reports.

Before a sync the ranks measure how far they drifted apart: the largest spread (max - min over
ranks) of a fixed sample of ``DRIFT_SAMPLE`` parameter elements, spread evenly over the tensors,
in one all-reduce (MAX) of twice that many floats. Rank 0 reports it as a ``sync`` event
(dashboard and run store), at most one every ``EVENT_INTERVAL`` seconds: an event covers the
syncs since the previous one (``syncs``) and carries their largest drift, how long the last
sync's measurement took (``drift_s``) and the whole sync (``sync_s``). A mode that measures at
some syncs only (gossip: ``gossip.DRIFT_EVERY``) folds the others into the next measured one.
"""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

from ..reporting.calls import event

#: Parameter elements sampled to measure drift.
DRIFT_SAMPLE = 1024
#: Seconds between two ``sync`` events at least (syncs in between are folded into the next).
EVENT_INTERVAL = 0.5


class Drift:
    """The drift of ``params`` across ranks (``measure``), and rank 0's ``sync`` events
    (``report``); ``measured_every``: the mode measures at every this-many-th sync only."""

    def __init__(self, params: list[torch.Tensor], mode: str, measured_every: int = 1) -> None:
        self.params = params
        self.mode = mode
        self.measured_every = measured_every
        per = max(1, DRIFT_SAMPLE // max(1, len(params)))
        self.sample_at = [
            torch.linspace(0, p.numel() - 1, min(per, p.numel()), device=p.device).round().long()
            for p in params
        ]
        self.pending = (0, 0.0)  # syncs not yet reported, their largest drift
        self.last_event = -math.inf

    def measure(self) -> float:
        """The largest spread over ranks of the sampled parameter elements (one all-reduce)."""
        if not self.params:
            return 0.0
        pairs = zip(self.params, self.sample_at, strict=True)
        v = torch.cat([p.detach().reshape(-1)[i].float() for p, i in pairs])
        both = torch.cat([v, -v])
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
        hi, neg_lo = both.split(v.numel())
        return float((hi + neg_lo).max())

    def report(
        self,
        drift: float | None,
        *,
        syncs: int,
        steps: int,
        drift_s: float,
        sync_s: float,
    ) -> None:
        """Rank 0: a ``sync`` event, at most one per ``EVENT_INTERVAL`` (the rest folded in);
        ``drift`` None: not measured at this sync, folded into the next event."""
        if dist.get_rank() != 0:
            return
        n, worst = self.pending
        n, worst = n + 1, max(worst, drift or 0.0)
        now = time.monotonic()
        if drift is None or now - self.last_event < EVENT_INTERVAL:
            self.pending = (n, worst)
            return
        self.pending, self.last_event = (0, 0.0), now
        tail = f" (largest of {n} syncs)" if n > 1 else ""
        if self.measured_every > 1:
            tail = f" (measured at every {self.measured_every}th sync)"
        event(
            "sync",
            f"{self.mode} sync {syncs} after step {steps}: ranks drifted {worst:.3g} apart{tail}",
            step=steps,
            drift=worst,
            syncs=n,
            sync_s=sync_s,
            drift_s=drift_s,
        )
