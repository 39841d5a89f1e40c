"""The interrupt button never lands halfway through the kernel's bookkeeping of a run.

The press is a real SIGINT to this process, sent from inside the section it must not break."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest

from nbdist.config import CellOptions, TelemetryConfig
from nbdist.notebook.run import interrupts
from nbdist.notebook.run.observers.assembly import assemble
from nbdist.notebook.run.observers.base import Observer, Phase
from nbdist.telemetry import events as ev
from nbdist.telemetry import series
from nbdist.telemetry.events import Batch, HealthSample, MetricRecord
from nbdist.telemetry.store import RunStore


def _press() -> None:
    os.kill(os.getpid(), signal.SIGINT)


def test_a_press_inside_is_raised_after_the_block_and_the_handler_is_back():
    before = signal.getsignal(signal.SIGINT)
    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.held():
            _press()
            done.append("after the press")
    assert done == ["after the press"]
    assert signal.getsignal(signal.SIGINT) is before


def test_held_sections_inside_one_another_raise_once_at_the_outermost_end():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.held():
            with interrupts.held():
                _press()
            done.append("the outer section's rest")
    assert done == ["the outer section's rest"]


def test_the_blocks_own_error_goes_on_and_nothing_is_left_pressed():
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(ValueError):
        with interrupts.held():
            _press()
            raise ValueError("its own")
    assert signal.getsignal(signal.SIGINT) is before
    with interrupts.held():  # a later section knows nothing of that press
        pass


class _Told(Observer):
    def __init__(self):
        self.records = 0

    def on_records(self, rank, records):
        self.records += len(records)


class _Presses(_Told):
    def on_records(self, rank, records):
        super().on_records(rank, records)
        if self.records == len(records):
            _press()


def _feeds():
    return {r: SimpleNamespace(metadata={"data": {}, "stdout": ""}, outcome=None, pid=100 + r)
            for r in (0, 1)}  # fmt: skip


def _send(feeds, t: float, step: int, extra: dict | None = None) -> None:
    for r, feed in feeds.items():
        rec = MetricRecord(t, step, 1.0 / (step + 1), 8, None, extra)
        seq = round(t * 1000) + step
        feed.metadata["data"][ev.key(feed.pid, seq)] = Batch(
            r, seq, t, [rec], HealthSample(t, "h", feed.pid)
        )


def _watch(tmp_path, extra=()):
    cfg = TelemetryConfig(silent_after=60.0)
    store = RunStore(tmp_path / "runs")
    w = assemble("nbdist.report(...)", CellOptions(), [0, 1], store_at=store, cfg=cfg, extra=extra)
    w.on_phase(Phase.STARTING, Phase.RUNNING)
    return w, store


def test_a_metrics_first_record_folded_whole_when_the_press_lands_inside(tmp_path, monkeypatch):
    """The press lands as a new metric's first curve is made (its sums not made yet): the CI
    failure in which the next look raised ``KeyError: 'train_loss'`` instead of "interrupted"."""
    pressed = []

    class PressingCurve(series.Curve):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if not pressed:
                pressed.append(True)
                _press()

    w, store = _watch(tmp_path)
    feeds = _feeds()
    _send(feeds, 1000.0, 0)
    w.poll(feeds)
    monkeypatch.setattr(series, "Curve", PressingCurve)
    _send(feeds, 1001.0, 1, {"train_loss": 0.5})
    with pytest.raises(KeyboardInterrupt):
        w.poll(feeds)
    assert pressed
    _send(feeds, 1002.0, 2, {"train_loss": 0.25})
    w.poll(feeds)  # whole: no KeyError
    run = w.collector.series
    assert {r: c.y for r, c in run.ranks["train_loss"].items()} == {0: [0.5, 0.25], 1: [0.5, 0.25]}
    w.close("interrupted")
    assert store.get_run(w.run_id)["status"] == "interrupted"


def test_every_observer_hears_the_records_the_press_landed_among(tmp_path):
    first, second = _Presses(), _Told()
    w, _ = _watch(tmp_path, extra=(first, second))
    feeds = _feeds()
    _send(feeds, 1000.0, 0)
    with pytest.raises(KeyboardInterrupt):
        w.poll(feeds)
    assert first.records == second.records == 2  # the one after the press was told too
