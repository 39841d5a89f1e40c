"""A rank's health, as every batch the sender sends carries it (a ``HealthSample``).

Its pace comes from what ``report()`` queued (the time of the last report, the time between the
last two, how many), counted on the sender's thread; its process's CPU and memory from psutil;
its GPU's memory and utilisation from torch, once the cell has initialised CUDA (utilisation
needs NVML); its pipeline's idle share and its mesh coordinates from the engine's state.

Communication share: for DistributedDataParallel models held in the cell's namespace, from DDP's
own timers (backward communication not overlapped with compute, over the step); otherwise from
``report(..., comm_time=SECONDS)`` when the cell measures it itself.

Data share: the share of its steps the rank waited for the next batch of a loader nbdist made
(``datawait``).
"""

from __future__ import annotations

import os
import socket
import sys
import time
import weakref

from ...telemetry.events import HealthSample
from .. import state
from .datawait import waits


class Health:
    """This engine's health: what a cell measures afresh (``begin_cell``), counted as the
    sender takes ``report()``'s records (``count``), sampled on demand (``sample``)."""

    def __init__(self) -> None:
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.proc = None  # psutil's Process, made at the first sample
        self.reset()

    def reset(self) -> None:
        self.last_report: float | None = None
        self.step_time: float | None = None
        self.reports = 0
        self.comm_time: float | None = None
        self.last_share: float | None = None  # DDP's comm share as last read
        # DDP's timed iteration of each model when the cell began: its comm share is shown
        # once the model has stepped in this cell (a new run's table starts empty)
        self.ddp_at_start: dict[int, int] = {}

    def begin_cell(self) -> None:
        """A watched cell starts (main thread): its pace, comm and data shares are its own."""
        if self.pid != os.getpid():  # this module may be imported before the engine was forked
            self.pid, self.proc = os.getpid(), None
        self.reset()
        waits.begin_cell()
        self.ddp_at_start = _ddp_iterations()
        state.engine.pipeline_idle = None  # a pipeline is shown once it steps in this cell

    def count(self, raw: list[tuple]) -> None:
        """``report()``'s tuples (``MetricRecord``'s order) as the sender takes them: the pace,
        counted off the training thread."""
        times = [self.last_report, *(t[0] for t in raw)]
        if times[-2] is not None:
            self.step_time = times[-1] - times[-2]
        self.last_report = times[-1]
        self.reports += len(raw)
        for rec in raw:
            if rec[5] and "comm_time" in rec[5]:
                self.comm_time = float(rec[5]["comm_time"])

    def sample(self) -> HealthSample:
        """The health sample of this moment."""
        import psutil

        if self.proc is None:
            self.proc = psutil.Process()
            self.proc.cpu_percent(None)
        gpu_util = gpu_mem = None
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            info = state.engine.rank_info
            dev = info.device if info is not None else "cuda:0"
            try:
                gpu_mem = torch.cuda.memory_allocated(dev)
                gpu_util = torch.cuda.utilization(dev)  # needs NVML (pynvml)
            except Exception:
                pass
        with self.proc.oneshot():
            cpu, rss = self.proc.cpu_percent(None), self.proc.memory_info().rss
        return HealthSample(
            time=time.time(),
            host=self.host,
            pid=self.pid,
            cpu=cpu,
            rss=rss,
            gpu_util=gpu_util,
            gpu_mem=gpu_mem,
            last_step=self.last_report,
            step_time=self.step_time,
            comm_share=self.comm_share(),
            data_share=waits.share(),
            reports=self.reports,
            pipeline=state.engine.pipeline if state.engine.pipeline_idle is not None else None,
            idle_share=state.engine.pipeline_idle,
            mesh=state.engine.mesh,
            collectives=state.engine.collective_calls,
            in_collective=state.engine.in_collective,
        )

    def comm_share(self) -> float | None:
        """The share of a step spent communicating: the cell's own ``comm_time`` over the step,
        else DDP's timers."""
        if self.comm_time is not None and self.step_time:
            return max(0.0, min(1.0, self.comm_time / self.step_time))
        if state.engine.in_collective:  # DDP's reducer holds its lock in there: not now
            return self.last_share
        self.last_share = _ddp_comm_share(self.ddp_at_start)
        return self.last_share


# -- DDP's timers ---------------------------------------------------------------------------------
_ddp_models: weakref.WeakSet = weakref.WeakSet()


def _ddp_logs() -> list[tuple[int, dict]]:
    """(id, DDP's logging data) of each DDP model the cells' namespace holds or held."""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    ddp = torch.nn.parallel.DistributedDataParallel
    for v in list(state.namespace().values()):
        if isinstance(v, ddp):
            _ddp_models.add(v)
    out = []
    for m in list(_ddp_models):
        try:
            out.append((id(m), m._get_ddp_logging_data()))  # torch's timers: no public API
        except Exception:
            continue
    return out


def _ddp_iterations() -> dict[int, int]:
    """The latest timed iteration of each DDP model, by id."""
    return {key: int(d.get("iteration", -1)) for key, d in _ddp_logs()}


def _ddp_comm_share(at_start: dict[int, int]) -> float | None:
    """Share of DDP's step spent in backward communication that did not overlap compute, for
    a model that has stepped since the cell began (``at_start``: its iteration then)."""
    for key, d in _ddp_logs():
        if int(d.get("iteration", -1)) <= at_start.get(key, -1):
            continue  # its timers are from an earlier cell
        comm = d.get("avg_backward_comm_time", 0)
        comm -= d.get("avg_backward_compute_comm_overlap_time", 0)
        compute = d.get("avg_forward_compute_time", 0) + d.get("avg_backward_compute_time", 0)
        if compute > 0:
            return max(0.0, comm) / (max(0.0, comm) + compute)
    return None
