"""Where a step's time goes on each rank, and which rank the others wait for (``--profile``).

Each rank sends what torch.profiler saw with its cell's outcome (``ProfileResult``:
``worker.debug.profile``). ``read`` reads the ranks together, per step:

- **communicating**: each collective's shortest duration over the ranks, the transfer itself
  (ranks run the same collectives in the same order, so the i-th of each is one collective);
- **waiting**: what a rank's collectives took beyond that: it waited for a slower rank;
- **waiting for data**: in ``next()`` on an nbdist loader (``worker.reporting.datawait``), or
  iterating a ``DataLoader``;
- **computing**: the rest of the step (the person's code, its kernels, whatever is not above).

Each rank's step is mostly one of three: computing, in collectives (communicating and waiting
for others) or waiting for data (``ProfileRow.mostly``). The straggler is the rank the others
wait for: the one that waits least, when the ranks' waits differ by more than a few per cent of
a step; its reason is where it spends more than the others, computing or waiting for data.
``read`` does that, in memory; ``keep`` merges the ranks' Chrome traces into one, each rank a
process (Perfetto and chrome://tracing open it), in the run's folder, and makes the profile the
one ``nbdist.profile()`` returns.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ... import config, datadir
from ...errors import UsageError
from ...protocol import ProfileResult
from ..cluster.fanout import targets_text

_SIGNIFICANT = 0.05  # of a step: waits that differ less say nothing about a straggler


@dataclass(frozen=True)
class ProfileRow:
    """One rank's step, in milliseconds per step (over ``steps`` steps)."""

    rank: int
    steps: int
    step_ms: float
    compute_ms: float
    comm_ms: float
    data_ms: float
    wait_ms: float

    @property
    def mostly(self) -> str:
        """Where most of the step goes: computing, in collectives or waiting for data."""
        parts = {
            "computing": self.compute_ms,
            "in collectives": self.comm_ms + self.wait_ms,
            "waiting for data": self.data_ms,
        }
        return max(parts, key=parts.__getitem__)


@dataclass(frozen=True)
class Profile:
    """A profiled cell: a row per rank, the straggler (a rank, or None) and why, and where the
    merged trace was written (None when no rank could send one)."""

    table: tuple[ProfileRow, ...]
    straggler: int | None
    reason: str
    trace: Path | None

    def text(self) -> str:
        """The table, the straggler and the trace, as the cell shows them."""
        head = f"{'rank':>4}  {'steps':>5}  {'step':>8}  {'computing':>9}  {'communicating':>13}"
        head += f"  {'waiting':>8}  {'waiting for data':>16}  {'mostly':<16}  (ms per step)"
        rows = [
            f"{r.rank:>4}  {r.steps:>5}  {r.step_ms:>8.1f}  {r.compute_ms:>9.1f}  "
            f"{r.comm_ms:>13.1f}  {r.wait_ms:>8.1f}  {r.data_ms:>16.1f}  {r.mostly}"
            for r in self.table
        ]
        trace = f"trace (one process per rank): {self.trace}" if self.trace else "no trace"
        return "\n".join([head, *rows, self.reason, trace])

    def shown(self) -> dict:
        """As the dashboard draws it: plain data."""
        return {
            "rows": [{**dataclasses.asdict(r), "mostly": r.mostly} for r in self.table],
            "straggler": self.straggler,
            "reason": self.reason,
        }

    def __repr__(self) -> str:
        return self.text()

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.text())


_last: Profile | None = None


def last() -> Profile:
    """The latest profile of this kernel (``nbdist.profile()``)."""
    if _last is None:
        raise UsageError("no profile yet: run a cell with %%distributed --profile [STEPS]")
    return _last


def read(results: Mapping[int, ProfileResult]) -> Profile:
    """The ranks' results read together (see the module's text), without their trace."""
    ranks = sorted(results)
    n = min((len(results[r].collectives) for r in ranks), default=0)
    transfer = [min(results[r].collectives[i] for r in ranks) for i in range(n)]
    rows = []
    for r in ranks:
        got = results[r]
        steps = max(1, got.steps)
        wait = sum(got.collectives[i] - transfer[i] for i in range(n))
        per = 1000.0 / steps
        step = got.seconds * per
        data, waiting = got.data * per, wait * per
        rows.append(
            ProfileRow(
                rank=r,
                steps=got.steps,
                step_ms=step,
                compute_ms=max(0.0, step - data - waiting),
                comm_ms=sum(transfer) * per,
                data_ms=data,
                wait_ms=waiting,
            )
        )
    straggler, reason = _straggler(rows)
    return Profile(tuple(rows), straggler, reason, None)


def keep(profiled: Profile, results: Mapping[int, ProfileResult], folder: Path | None) -> Profile:
    """``profiled`` with the ranks' traces merged into ``folder`` (when given): from now on
    what ``last()`` returns."""
    global _last
    trace = _merge(results, folder) if folder is not None else None
    _last = dataclasses.replace(profiled, trace=trace)
    return _last


def folder_of(run_id: int | None) -> Path:
    """The run's folder (``data_dir()/runs/ID``), made private when missing."""
    base = datadir.ensure(config.data_dir())
    return datadir.private_dir(
        datadir.private_dir(base / "runs") / str(run_id if run_id is not None else "unrecorded")
    )


def _straggler(rows: list[ProfileRow]) -> tuple[int | None, str]:
    if len(rows) < 2:
        return None, "one rank: no one waits for another"
    step = statistics.median(r.step_ms for r in rows)
    waits = [r.wait_ms for r in rows]
    if max(waits) - min(waits) <= _SIGNIFICANT * step:
        return None, "no straggler: the ranks wait about as long for each other"
    slow = min(rows, key=lambda r: r.wait_ms)
    others = [r for r in rows if r is not slow]
    excess = {
        "computing": slow.compute_ms - statistics.median(r.compute_ms for r in others),
        "waiting for data": slow.data_ms - statistics.median(r.data_ms for r in others),
    }
    what = max(excess, key=excess.get)
    mine = slow.compute_ms if what == "computing" else slow.data_ms
    theirs = mine - excess[what]
    waiting = statistics.median(r.wait_ms for r in others)
    return slow.rank, (
        f"straggler: rank {slow.rank}, {what} {mine:.1f} ms per step against {theirs:.1f} on the "
        f"others ({targets_text([r.rank for r in others])} wait {waiting:.1f} ms per step for it)"
    )


def _merge(results: Mapping[int, ProfileResult], folder: Path) -> Path | None:
    """The ranks' traces as one Chrome trace, each rank a process named after it."""
    events: list = []
    for rank in sorted(results):
        packed = results[rank].trace
        if packed is None:
            continue
        try:
            trace = json.loads(gzip.decompress(packed))
        except (OSError, ValueError):  # a damaged trace: the others are still worth having
            continue
        for e in trace.get("traceEvents", []):
            if isinstance(e, dict):
                events.append({**e, "pid": rank})
        for name, args in (
            ("process_name", {"name": f"rank {rank}"}),
            ("process_sort_index", {"sort_index": rank}),
        ):
            events.append({"name": name, "ph": "M", "pid": rank, "args": args})
    if not events:
        return None
    path = folder / "trace.json"
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", opener=lambda p, flags: os.open(p, flags, 0o600)) as f:  # yours alone
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    tmp.replace(path)
    return path
