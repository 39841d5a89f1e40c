"""What the run endpoints send, bounded whatever a run's length, as strict JSON.

A run of a million steps on many ranks has millions of metric rows, and a store thousands of
runs; no answer holds them all. Runs go out a page at a time (``runs_page``), with their total.
Raw rows go out a page at a time (``metrics_page``, ``events_page``: at most ``MAX_PAGE`` rows,
with the cursor of the next page); curves go out decimated (``curves``). Every answer is
encoded by ``encode``, on the server's reader threads (not its event loop): strict JSON, in
which a number that is not finite (a NaN, an infinity, which JSON has no word for, and which the
store keeps out but an older store may hold) is ``null``, as the sidebar's types say.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..telemetry.listing import RunQuery
from ..telemetry.store import RunStore

#: Runs in one answer, at most.
MAX_RUNS = 1000
#: Metric rows in one answer by default, and at most (about 150 bytes each in JSON).
METRICS_PAGE = 1000
MAX_PAGE = 10_000
#: Events in one answer by default, and at most.
EVENTS_PAGE = 1000
MAX_EVENTS = 1000


def runs_page(store: RunStore, query: RunQuery) -> dict[str, Any]:
    """The page of runs ``query`` asks for: ``runs``, ``total`` (every run it finds), its
    ``offset`` and ``limit``, and ``metrics`` (what the runs' summaries hold: what they sort
    by)."""
    runs, total = store.find_runs(query)
    return {
        "runs": runs,
        "total": total,
        "offset": query.offset,
        "limit": query.limit,
        "metrics": store.metric_names(),
    }


def metrics_page(store: RunStore, run_id: int, since_id: int, limit: int) -> dict[str, Any]:
    """Metric rows after row ``since_id``, at most ``limit``: ``metrics``, ``last_id`` (where
    the next poll starts) and ``next`` (the ``since_id`` of the next page; null when this page
    holds every row there is now)."""
    rows = store.metrics(run_id, since_id, limit + 1)  # one more: is there a next page?
    more = len(rows) > limit
    rows = rows[:limit]
    last = rows[-1]["id"] if rows else since_id
    return {"metrics": rows, "last_id": last, "next": last if more else None}


def events_page(store: RunStore, run_id: int, since_id: int | None, limit: int) -> dict[str, Any]:
    """A run's events, oldest first: after ``since_id`` (a page, as ``metrics_page``), or,
    without it, the latest ``limit``; and ``total``, how many the run has."""
    if since_id is None:
        rows, more = store.latest_events(run_id, limit), False
    else:
        rows = store.events(run_id, since_id, limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
    last = rows[-1]["id"] if rows else (since_id or 0)
    total = store.count_events(run_id)
    return {"events": rows, "last_id": last, "next": last if more else None, "total": total}


def encode(data: Any) -> str:
    """``data`` as strict JSON: a number that is not finite as null."""
    try:
        return json.dumps(data, allow_nan=False)
    except ValueError:  # a NaN or an infinity somewhere (rare: the store refuses them)
        return json.dumps(_nulled(data), allow_nan=False)


def _nulled(value: Any) -> Any:
    """A copy of ``value`` with each float that is not finite replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _nulled(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nulled(v) for v in value]
    return value
