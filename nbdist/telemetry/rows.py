"""A record as the row that goes into the run store, and a row as what comes out.

Values are stored JSON-safe: a NaN or infinite number is never written. Numbers are checked where
they enter (the row builders below): a measure or a rate that is not a finite number is stored
as NULL; a row whose time is not a finite number, or whose step or rank does not fit SQLite's
64-bit integers, is refused with a ``BadValue`` that says which (``build_rows``: one bad record
costs only itself). Each table's INSERT is made here beside the builder of its values, from the
column lists (``events``, ``tables.HISTORY_COLUMNS``).
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import RankFailure, cause
from .events import (
    EVENT_COLUMNS,
    HEALTH_COLUMNS,
    METRIC_COLUMNS,
    MetricRecord,
    RunEvent,
    WorkerHealth,
)
from .tables import HISTORY_COLUMNS


def _insert(table: str, columns: tuple[str, ...], verb: str = "INSERT") -> str:
    return (
        f"{verb} INTO {table} (run_id, {', '.join(columns)}) "
        f"VALUES ({', '.join('?' * (len(columns) + 1))})"
    )


INSERT_METRIC = _insert("metrics", (*METRIC_COLUMNS, "nonfinite"))
_metric_values = operator.itemgetter(*METRIC_COLUMNS)
INSERT_HEALTH = _insert("health", HEALTH_COLUMNS, "INSERT OR REPLACE")
INSERT_HISTORY = _insert("health_samples", HISTORY_COLUMNS)
INSERT_EVENT = _insert("events", EVENT_COLUMNS)


#: SQLite's INTEGER: a signed 64-bit number.
INT_MIN, INT_MAX = -(2**63), 2**63 - 1


class BadValue(ValueError):
    """A value the store cannot keep: the record that holds it is refused, with this line."""


class Refused:
    """Records left out because the store cannot keep them: how many, and the first reason."""

    def __init__(self) -> None:
        self.count = 0
        self.first = ""

    def add(self, reason: BadValue | str, count: int = 1) -> None:
        self.count += count
        self.first = self.first or str(reason)

    def merge(self, other: Refused) -> None:
        if other.count:
            self.add(other.first, other.count)


def build_rows(
    build: Callable[..., tuple], items: Iterable[tuple], refused: Refused | None
) -> list[tuple]:
    """``build(*item)`` for each item. An item it refuses (``BadValue``) raises, or, given
    ``refused``, is left out and counted there: one bad record costs only itself."""
    items = list(items)
    try:
        return [build(*item) for item in items]
    except BadValue:
        if refused is None:
            raise
    out = []
    for item in items:
        try:
            out.append(build(*item))
        except BadValue as e:
            refused.add(e)
    return out


# -- values ---------------------------------------------------------------------------------------
def split_loss(loss: Any) -> tuple[float | None, str | None]:
    """A loss as (finite value or None, ``nan``/``inf``/``-inf`` or None)."""
    if loss is None:
        return None, None
    try:
        loss = float(loss)
    except OverflowError:  # an integer past any float: infinite, as far as a loss goes
        loss = math.inf if loss > 0 else -math.inf
    if math.isnan(loss):
        return None, "nan"
    if math.isinf(loss):
        return None, "inf" if loss > 0 else "-inf"
    return loss, None


def json_safe(value: Any) -> Any:
    """JSON-safe copy: non-finite floats become their name as a string."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def to_json(value: Any) -> str:
    """``value`` as JSON text for a TEXT column: non-finite numbers as their names. (The common
    case, finite numbers only, is encoded at once: a metric row's extras, many a second.)"""
    try:
        return json.dumps(value, allow_nan=False)
    except (ValueError, TypeError):  # NaN or inf, or what JSON has no word for: made safe
        return json.dumps(json_safe(value), default=repr, allow_nan=False)


def real(v: Any) -> float | None:
    """``v`` as a finite float for a REAL column; None for None, NaN, infinity, or what is not a
    number (a measure or a rate that cannot be drawn is unknown, not a point at infinity)."""
    if type(v) is float:  # the common case, at once (inf - inf and nan - nan are nan)
        return v if v - v == 0.0 else None
    if v is None or isinstance(v, (bool, str, bytes)):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return f if math.isfinite(f) else None


def whole(v: Any) -> int | None:
    """``v`` as an int that SQLite's INTEGER holds; None for None, or a number it cannot hold."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, float):
        if not v.is_integer():
            return None
        v = int(v)
    try:
        i = int(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return i if INT_MIN <= i <= INT_MAX else None


def _time(v: Any, what: str) -> float:
    """A row's time (seconds since the epoch), which must be a finite number."""
    if type(v) is float and v - v == 0.0:
        return v
    t = real(v)
    if t is None:
        raise BadValue(f"{what}'s time {_short(v)} is not a finite number")
    return t


def _int(v: Any, name: str, what: str) -> int | None:
    """A row's ``name`` (a step, a rank), which must be None or fit SQLite's 64-bit INTEGER."""
    if v is None or (type(v) is int and INT_MIN <= v <= INT_MAX):
        return v
    i = whole(v)
    if i is None or i != v:
        raise BadValue(f"{what}'s {name} {_short(v)} is not a whole number from -2**63 to 2**63-1")
    return i


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


# -- rows in --------------------------------------------------------------------------------------
def metric_row(run_id: int, rank: int, rec: MetricRecord) -> tuple:
    """``rec`` from ``rank`` as values for ``INSERT_METRIC``."""
    loss, nonfinite = split_loss(rec.loss)
    t, step, samples = rec.time, rec.step, rec.samples
    # the checks' common cases inline: this runs for every record of a run
    if not (type(t) is float and t - t == 0.0):
        t = _time(t, "a metric record")
    if not (type(step) is int and INT_MIN <= step <= INT_MAX):
        step = _int(step, "step", "a metric record")
    if not (type(rank) is int and INT_MIN <= rank <= INT_MAX):
        rank = _int(rank, "rank", "a metric record")
    values = {
        "time": t,
        "rank": rank,
        "step": step,
        "loss": loss,
        "samples": real(samples),
        "extra": to_json(rec.extra) if rec.extra else None,
    }
    return (run_id, *_metric_values(values), nonfinite)


def metric_from_dict(row: dict[str, Any]) -> tuple[int, MetricRecord]:
    """A metric row given as a dict (``rank`` and the record's fields) as (rank, record)."""
    return row["rank"], MetricRecord(row["time"], *(row.get(f) for f in MetricRecord._fields[1:]))


#: A mesh's coordinates as text are short ("pp 1/2 dp 0/2 tp 1/2"): more is not kept.
_MESH_CHARS = 200


def _health_values(h: WorkerHealth) -> dict[str, Any]:
    """``h``'s columns, stored safely: text never NULL, non-finite measures as NULL."""
    out = {c: real(getattr(h, c)) for c in HEALTH_COLUMNS}
    out.update(
        rank=_int(h.rank, "rank", "a health sample"),
        time=_time(h.time, "a health sample"),
        host=str(h.host or ""),
        state=str(h.state or "ok"),
        mesh=str(h.mesh)[:_MESH_CHARS] if h.mesh else None,
    )
    return out


def health_row(run_id: int, h: WorkerHealth) -> tuple:
    """``h`` as values for ``INSERT_HEALTH``."""
    values = _health_values(h)
    return (run_id, *(values[c] for c in HEALTH_COLUMNS))


def history_row(run_id: int, h: WorkerHealth) -> tuple:
    """``h`` as values for ``INSERT_HISTORY``."""
    values = _health_values(h)
    return (run_id, *(values[c] for c in HISTORY_COLUMNS))


def event_from_dict(row: dict[str, Any]) -> RunEvent:
    """An event given as a dict (time, kind and maybe rank, message, data)."""
    return RunEvent(
        row["time"], row["kind"], row.get("rank"), row.get("message") or "", row.get("data")
    )


def event_row(run_id: int, e: RunEvent) -> tuple:
    """``e`` as values for ``INSERT_EVENT``: the message as text, the data as JSON."""
    values = e._replace(
        time=_time(e.time, "an event"),
        kind=str(e.kind),
        rank=_int(e.rank, "rank", "an event"),
        message=str(e.message or ""),
        data=to_json(e.data) if e.data else None,
    )
    return (run_id, *values)


# -- rows out ------------------------------------------------------------------------------------
def decoded(rows: list, column: str) -> list[dict]:
    """The rows as dicts, ``column`` (stored as JSON text) decoded; empty: ``{}``."""
    out = []
    for r in rows:
        row = dict(r)
        row[column] = json.loads(row[column]) if row[column] else {}
        out.append(row)
    return out


def error_line(failures: list[dict]) -> str:
    """The run's cause by ``errors.cause``'s rule, as "ranks 0-3: KeyError: 'b'"; "" if none."""
    try:
        found = [
            RankFailure(f["rank"], str(f["summary"]), kind=str(f["kind"]), at=float(f.get("at", 0)))
            for f in failures
        ]
    except (KeyError, TypeError, ValueError):
        return ""
    root = cause(found)
    return root.line() if root else ""
