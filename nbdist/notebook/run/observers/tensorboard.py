"""TensorBoard logs of the run (``--tensorboard DIR``): each rank's metrics (``loss/rank1``),
their means over ranks (``loss/mean``), samples/s once a second, and the events as text. torch
is imported only with the option (its ``SummaryWriter``)."""

from __future__ import annotations

from typing import Any

from ....errors import UsageError
from ....telemetry.events import MetricRecord, RunEvent
from .base import Observer, RunEnd, Tick

_RATE_EVERY = 1.0  # seconds between samples/s points


def writer(logdir: str) -> Any:
    """A TensorBoard ``SummaryWriter`` on ``logdir``; one line when it cannot be had."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception:
        raise UsageError(
            "--tensorboard needs the tensorboard package: pip install tensorboard"
        ) from None
    try:
        return SummaryWriter(log_dir=logdir)
    except OSError as e:
        raise UsageError(f"--tensorboard: cannot write to {logdir!r} ({e.strerror})") from None


class TensorBoard(Observer):
    """One run's TensorBoard logs (``tb``: the writer, made by ``writer``)."""

    def __init__(self, tb: Any):
        self.tb = tb
        self._last_rate = 0.0

    def on_records(self, rank: int, records: list[MetricRecord]) -> None:
        for rec in records:
            if rec.step is None:
                continue
            if rec.loss is not None:
                self.tb.add_scalar(f"loss/rank{rank}", rec.loss, rec.step, walltime=rec.time)
            for k, v in (rec.extra or {}).items():
                self.tb.add_scalar(f"{k}/rank{rank}", v, rec.step, walltime=rec.time)

    def on_mean(self, name: str, step: float, value: float) -> None:
        self.tb.add_scalar(f"{name}/mean", value, step)

    def on_event(self, event: RunEvent) -> None:
        self.tb.add_text("events", f"{event.kind} rank {event.rank}: {event.message}")

    def on_tick(self, tick: Tick) -> None:
        if tick.now - self._last_rate < _RATE_EVERY:
            return
        self._last_rate = tick.now
        rate = tick.live.samples_per_s()
        if rate is not None:
            self.tb.add_scalar("samples_per_s", rate, tick.live.done() or 0)

    def on_end(self, end: RunEnd) -> None:
        self.tb.close()
