"""A finished run, sent from the run store to a tracker afterwards: ``Run.to_mlflow()``,
``to_wandb()``, ``to_comet()`` (``board.runs``).

The same sinks as a live run, called here in turn: the run's options (and a trial's values) as
parameters, every metric per rank and its mean over ranks as the boards fold them (at most a few
thousand points a curve, spikes kept), each rank's last health, the counts of events and the
events themselves, the run's status and summary; asked, its checkpoints, only while their
folder is still the run's own, and only its complete checkpoints (``checkpoint.snapshot``).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from pathlib import Path
from typing import Any

from ... import config
from ...errors import UsageError
from ...telemetry.series import RunSeries, fold_rows
from ...telemetry.store import RunStore
from ...worker.checkpoint import snapshot
from . import sinks
from .live import run_info
from .sinks import Point

_CHUNK = 5000  # points per call of the sink


def send(record: dict, store: RunStore, tracker: str, checkpoints: bool = False) -> Any:
    """Send the kept run ``record`` to ``tracker``; return the tracker's own run (its id for
    MLflow, the run object for W&B, the experiment for Comet). ``checkpoints``: the run's
    checkpoint folder too (its last checkpoint event names it), if it is on this machine and
    still the run's own: checked before the tracker's run is opened."""
    (name,) = config.tracker_names(tracker)
    if record["status"] == "running":
        raise UsageError(f"run {record['id']} is still running: send it once it has ended")
    rid, opts = record["id"], record.get("options") or {}
    with _checkpoints(store, rid) if checkpoints else contextlib.nullcontext() as folder:
        sinks.check([name])
        info = run_info(record["name"], rid, opts, record.get("label") or "", record["started"])
        t = record.get("ended") or record["updated"]
        sink = sinks.make(name)
        sink.open(info)
        points = _points(store, rid, t)
        for i in range(0, len(points), _CHUNK):
            sink.log(points[i : i + _CHUNK])
        if folder is not None:
            sink.upload(folder)
        summary = {k: float(record[k]) for k in ("step", "loss", "samples_per_s") if record.get(k)}
        sink.close(record["status"], summary, store.events(rid))
    return sink.handle


def _checkpoints(store: RunStore, rid: int) -> contextlib.AbstractContextManager[Path]:
    """The run's complete checkpoints in the folder its last checkpoint was written to, pinned
    (``snapshot.pinned``) once that folder is checked to be on this machine and the run's own."""
    written = [e for e in store.events(rid) if e["kind"] == "checkpoint"]
    data = (written[-1].get("data") or {}) if written else {}
    folder = data.get("folder")
    if not folder:
        raise UsageError(f"run {rid} wrote no checkpoint: send it without checkpoints=True")
    if not Path(folder).is_dir():
        raise UsageError(
            f"run {rid}'s checkpoints were written to {folder} on its rank 0's host, which this "
            "machine does not have: copy them here, or send the run without checkpoints=True"
        )
    if not data.get("run"):
        raise UsageError(
            f"run {rid}'s checkpoint events do not say which run wrote {folder} (an earlier "
            "nbdist wrote them), so it may hold another run's: send the run without "
            "checkpoints=True"
        )
    return snapshot.pinned(Path(folder), data["run"], rid)


def _points(store: RunStore, rid: int, t: float) -> list[Point]:
    series = RunSeries()
    fold_rows(series, store.metrics(rid))
    series.settle(final=True)
    out = []
    for name in series.names:
        for rank, curve in sorted(series.ranks[name].items()):
            out += [
                Point(f"{name}/rank{rank}", int(x), y, t)
                for x, y in zip(curve.x, curve.y, strict=True)
            ]
        mean = series.mean[name]
        out += [Point(f"{name}/mean", int(x), y, t) for x, y in zip(mean.x, mean.y, strict=True)]
    last = max((p.step for p in out), default=0)
    counts = Counter(e["kind"] for e in store.events(rid))
    out += [Point(f"events/{k}", last, float(n), t) for k, n in counts.items()]
    for h in store.health(rid):
        for key, v, scale in (("cpu", h.get("cpu"), 1), ("rss_mb", h.get("rss"), 2**20),
                              ("gpu_util", h.get("gpu_util"), 1),
                              ("gpu_mem_mb", h.get("gpu_mem"), 2**20)):  # fmt: skip
            if v is not None:
                out.append(Point(f"health/rank{h['rank']}/{key}", last, v / scale, t))
    return out
