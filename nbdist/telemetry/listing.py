"""Which runs are listed, and how a page of them is asked for: the rule, the query, its SQL.

A run is a ``%%distributed`` cell (or a script, or a sweep's trial) that reported a metric,
wrote a checkpoint, was named (``--name``) or failed. Any other cell (``print("hi")``, the cell
that defines the model) is kept as a cell of the session, listed only when asked (``all``). A
run is listed while it runs; at its end ``LISTED`` decides, from what it left in the store
(``RunStore.end_run``). Every run a store of an earlier version holds stays listed.

``RunQuery`` is what a reader asks for (the sidebar's ``GET runs``, ``nbdist.runs()``): a page
(``offset``, ``limit``), a part of the name (``name``, any case), statuses, and a sort: ``time``
(the start), ``duration``, ``name``, ``status``, ``step``, or a metric of the runs' summaries
(``loss``: its last mean over ranks; ``min:loss``, ``max:acc``, ``last:acc``), ``asc`` or
``desc`` (by default: the latest, longest and furthest first; names, statuses and metrics from
the least). Runs without the value sorted on come last either way. A bad value raises
``UsageError``: one line that names the valid ones. ``where`` and ``order`` are its SQL on the
runs table, which the store reads (the page, newest first, through the ``runs_listed`` index).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError
from .events import RUN_STATUSES

#: Whether an ended run is listed, from what it left (SQL on the ``runs`` row being ended).
LISTED = (
    "name != '' OR status = 'failed'"
    " OR EXISTS (SELECT 1 FROM metrics WHERE run_id = runs.id)"
    " OR EXISTS (SELECT 1 FROM summaries WHERE run_id = runs.id)"
    " OR EXISTS (SELECT 1 FROM events WHERE run_id = runs.id AND kind = 'checkpoint')"
)
#: A run's status as read: ``lost`` for a running one whose writer is gone (``?``: the time
#: before which a running run's last write makes it lost).
STATUS = "(CASE WHEN runs.status = 'running' AND runs.updated < ? THEN 'lost' ELSE runs.status END)"
#: What a run may be sorted by, besides a metric: its SQL, and whether it goes down by default.
FIELDS = {
    "time": ("runs.started", True),
    "duration": ("(COALESCE(runs.ended, runs.updated) - runs.started)", True),
    "name": ("NULLIF(runs.name, '') COLLATE NOCASE", False),
    "status": (STATUS, False),
    "step": ("runs.step", True),
}
#: A metric's summary values (``summaries``' columns): ``min:loss``; a bare name is its last.
AGGREGATES = ("last", "min", "max")
MAX_LIMIT = 100_000  # runs one query reads (the server's pages hold at most 1,000)
_MAX_TEXT = 200  # characters of a name searched for, or a metric sorted by


@dataclass(frozen=True)
class RunQuery:
    """A page of runs: which (``name``: a part of it; ``status``: any of these, given as a
    tuple or as "ok,failed"; ``all``: the session's other cells too), in what order (``sort``,
    ``order``: asc | desc, or "" for the sort's own), and where (``offset``, ``limit``)."""

    offset: int = 0
    limit: int = 20
    name: str = ""
    status: tuple[str, ...] = ()
    sort: str = "time"
    order: str = ""
    all: bool = False

    def __post_init__(self) -> None:
        _whole("offset", self.offset, 0, 2**62)
        _whole("limit", self.limit, 1, MAX_LIMIT)
        if not isinstance(self.name, str) or len(self.name) > _MAX_TEXT:
            raise UsageError(f"name takes a part of a run's name (text), not {self.name!r:.60}")
        status = self.status
        if isinstance(status, str):
            status = tuple(s for s in status.split(",") if s)
        elif not isinstance(status, (tuple, list)):
            status = (status,)
        object.__setattr__(self, "status", tuple(status))
        bad = [s for s in self.status if not isinstance(s, str) or s not in RUN_STATUSES]
        if bad:
            raise UsageError(
                f"status {bad[0]!r:.40} is not a run's status: use {', '.join(RUN_STATUSES)}"
            )
        if self.order not in ("", "asc", "desc"):
            raise UsageError(f"order takes asc or desc, not {self.order!r:.40}")
        self.key()  # the sort, checked

    def key(self) -> tuple[str, str | None]:
        """The sort as (field or aggregate, metric name or None): ``("time", None)``,
        ``("min", "loss")``."""
        sort = self.sort
        if not isinstance(sort, str) or not sort or len(sort) > _MAX_TEXT:
            raise UsageError(f"sort takes {_SORTS}, not {sort!r:.60}")
        if sort in FIELDS:
            return sort, None
        agg, sep, metric = sort.partition(":")
        if sep and agg in AGGREGATES and metric:
            return agg, metric
        if sep and agg in AGGREGATES:
            raise UsageError(f"sort {sort!r:.60} names no metric: use {agg}:loss, say")
        return "last", sort

    def descending(self) -> bool:
        """Whether the sort goes from the greatest."""
        if self.order:
            return self.order == "desc"
        field, metric = self.key()
        return metric is None and FIELDS[field][1]

    def where(self, stale_before: float, legacy: bool = False) -> tuple[str, list]:
        """The WHERE clause (with its parameters) of the runs asked for; ``legacy``: a store
        of an earlier version, where every run is listed."""
        parts, args = [], []
        if not self.all and not legacy:
            parts.append("runs.listed = 1")
        if self.name:
            parts.append("(runs.name LIKE ? ESCAPE '\\' OR runs.label LIKE ? ESCAPE '\\')")
            like = "%" + "".join("\\" + c if c in "%_\\" else c for c in self.name) + "%"
            args += [like, like]
        if self.status:
            parts.append(f"{STATUS} IN ({', '.join('?' * len(self.status))})")
            args += [stale_before, *self.status]
        return (" WHERE " + " AND ".join(parts) if parts else ""), args

    def order_by(self, stale_before: float, legacy: bool = False) -> tuple[str, list, str, list]:
        """(a JOIN for a metric's summary or "", its parameters, the ORDER BY clause, its
        parameters): runs without the value last, then the newest first."""
        field, metric = self.key()
        join, join_args, args = "", [], []
        if metric is None:
            value = FIELDS[field][0]
            args = [stale_before] if value == STATUS else []
        elif legacy:  # no summaries yet: the runs row's last loss, else nothing to sort by
            value = "runs.loss" if (field, metric) == ("last", "loss") else ""
        else:
            join = " LEFT JOIN summaries AS s ON s.run_id = runs.id AND s.name = ?"
            value, join_args = f"s.{field}", [metric]
        latest = "runs.started DESC, runs.id DESC"
        if not value:
            return join, join_args, f" ORDER BY {latest}", []
        way = "DESC" if self.descending() else "ASC"
        return join, join_args, f" ORDER BY {value} IS NULL, {value} {way}, {latest}", args * 2


_SORTS = ", ".join(FIELDS) + ", or a metric: loss, min:loss, max:acc"


def _whole(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UsageError(f"{name} takes a whole number from {low} to {high}, not {value!r:.40}")
