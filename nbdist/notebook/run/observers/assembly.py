"""Where a run is put together: its typed options in, its watch and observers out.

``assemble`` is the one place that decides what watches a run. Each output is one observer
with one job, listed on one line below: a new output is a new module beside these and a line
here. Whatever can refuse the run (a tracker whose package is missing, a TensorBoard folder that
cannot be written) refuses it first, in one line, before the run's row is written.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable

from ....config import CellOptions, TelemetryConfig
from ....protocol import TrialInfo
from ....telemetry.store import RunStore
from ....telemetry.writer import StoreWriter
from ...trackers import sinks
from . import store, tensorboard
from .base import Observer, RunInfo, Stop
from .dashboard import Board
from .health import HealthRows
from .profile import ProfileTable
from .stop_on_nan import StopOnNan
from .trackers import Trackers
from .watch import Watch


def assemble(
    source: str,
    opts: CellOptions,
    ranks: Iterable[int],
    *,
    cluster_id: str = "",
    trial: TrialInfo | None = None,
    label: str = "",
    extra: Iterable[Observer] = (),
    store_at: RunStore | None = None,
    cfg: TelemetryConfig | None = None,
) -> Watch:
    """The watch of one run of ``source`` on ``ranks`` (the cluster's) as ``opts`` asks: the
    run store, the ranks' health, the dashboard (not a sweep's trial: the sweep has its board,
    among ``extra``), trackers, TensorBoard, ``--stop-on-nan``, ``--profile``."""
    cfg = cfg or TelemetryConfig()
    sinks.check(opts.track)  # a missing package: one line, before the run
    tb = tensorboard.writer(opts.tensorboard) if opts.tensorboard else None
    info = RunInfo(None, source, opts, tuple(ranks), time.time(), cluster_id, trial, label)
    writer = StoreWriter(store_at or RunStore(), cfg.store_interval)
    info = dataclasses.replace(info, run_id=store.start(writer, info))
    stop = Stop()
    observers = [
        store.RunRecord(writer, info.run_id),
        HealthRows(writer, info.run_id),
        ProfileTable(info.run_id) if opts.profile else None,
        Board(info, cfg) if opts.dashboard and trial is None else None,
        Trackers(info) if opts.track else None,
        tensorboard.TensorBoard(tb) if tb is not None else None,
        StopOnNan(stop) if opts.stop_on_nan else None,
        *extra,
    ]
    kept = [o for o in observers if o is not None]
    return Watch(info, kept, cfg, stop, closers=[writer.close])


def bare(
    source: str, opts: CellOptions, ranks: Iterable[int], observers: Iterable[Observer]
) -> Watch:
    """A watch with only ``observers``: nothing recorded, nothing shown (tests watch a run so)."""
    return Watch(RunInfo(None, source, opts, tuple(ranks), time.time()), observers)
