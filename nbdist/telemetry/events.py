"""The telemetry schema, one for all places: what engines send, the collector keeps, the store has.

Engines publish *batches* through ipyparallel's data publication (``publish_data``), each under a
fresh key ``nbdist:<pid>:<seq>`` in the result's ``metadata['data']``; the collector pops the keys
it has read, so a batch is never overwritten nor read twice. A batch is a plain dict::

    {"v": 1, "rank": 0, "seq": 7, "sent": 1718000000.1,
     "metrics": [(time, step, loss, samples, total, extra), ...],
     "health": {...HEALTH_FIELDS...} or None,
     "events": [(time, kind, message, data), ...]}

The same names are the run store's columns and the sidebar's JSON fields.
"""

from __future__ import annotations

import math
from typing import Any

#: Version of the batch format; the collector ignores batches of another version.
VERSION = 1
#: Prefix of the data-publication keys nbdist owns.
KEY_PREFIX = "nbdist:"

#: A rank's state as the notebook classifies it.
OK, SLOW, SILENT, DEAD = "ok", "slow", "silent", "dead"
STATES = (OK, SLOW, SILENT, DEAD)

#: Run statuses in the store. ``lost``: the kernel writing it stopped without closing it.
RUN_STATUSES = ("running", "ok", "failed", "interrupted", "stopped", "lost")

#: Event kinds. Fault tolerance adds its own with ``RunMonitor.event``; these are the known ones.
EVENT_KINDS = (
    "started", "finished", "failed", "died", "restart", "checkpoint", "nan", "slow", "silent",
    "recovered", "stopped", "warning",
)

#: One metric record as it travels: a tuple, cheap to build on the engine and to pickle.
METRIC_FIELDS = ("time", "step", "loss", "samples", "total", "extra")

#: Health sample fields (engine side), plus what the collector adds (``state``, ages).
HEALTH_FIELDS = (
    "time",  # engine clock when sampled
    "host",
    "pid",
    "cpu",  # % of one core, since the previous sample
    "rss",  # bytes
    "gpu_util",  # %, None without CUDA (or without NVML)
    "gpu_mem",  # bytes allocated by torch on this rank's GPU, None without CUDA
    "last_step",  # engine time of the last report(), None before the first
    "step_time",  # seconds between the last two report() calls
    "comm_share",  # fraction of the step spent waiting in collectives, None if unknown
    "reports",  # report() calls so far in this cell
)


def key(pid: int, seq: int) -> str:
    """The data-publication key of one batch: unique per engine process and sequence number."""
    return f"{KEY_PREFIX}{pid}:{seq}"


def batch(rank: int, seq: int, sent: float, metrics: list, health: dict | None,
          events: list) -> dict:
    """One batch, as the engine publishes it."""
    return {"v": VERSION, "rank": rank, "seq": seq, "sent": sent, "metrics": metrics,
            "health": health, "events": events}


def finite(x: Any) -> bool:
    """True for a real, finite number; False for NaN, +-inf (and for None)."""
    return isinstance(x, (int, float)) and math.isfinite(x)


def metric_dict(rec: tuple | list, rank: int) -> dict:
    """A metric record as the dict the store's readers return (without ``id``)."""
    t, step, loss, samples, total, extra = rec
    return {"time": t, "rank": rank, "step": step, "loss": loss, "samples": samples,
            "total": total, "extra": extra or {}}
