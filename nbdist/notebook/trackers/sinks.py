"""What a tracker is to nbdist, and how several are fed without holding anything up.

A sink (``Sink``) opens one tracker run for one nbdist run (``RunInfo``), takes batches of
points (``Point``: a metric's value at a step) and closes the run with its status, summary and
events. ``TRACKERS`` says where each of ``--track``'s names is found; ``check`` refuses, in one
line naming the pip command, a tracker whose package is missing (without importing it: that
happens on the sink's own thread).

``Fanout`` gives each sink a thread and a bounded queue: the kernel's main thread only appends
to queues. A sink that raises is dropped with one warning; one that falls behind loses its
oldest batches, with one warning; neither ever blocks the collector or the training. The
warnings are kept here and printed by the main thread (``take_warnings``), under the cell.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from ... import config
from ...errors import UsageError

#: name (``config.TRACKERS``, which ``--track`` takes) -> (module of its sink, the package to
#: import, the pip command that installs it)
TRACKERS = dict(
    zip(
        config.TRACKERS,
        (
            ("mlflow_sink", "mlflow", "pip install mlflow"),
            ("wandb_sink", "wandb", "pip install wandb"),
            ("comet_sink", "comet_ml", "pip install comet_ml"),
        ),
        strict=True,
    )
)
QUEUE_LIMIT = 60  # batches a sink may fall behind (a minute at one a second) before dropping
CLOSE_WAIT = 30.0  # seconds the end of a run waits for its trackers, all together


class Point(NamedTuple):
    """One value of one metric: ``loss/mean``, ``loss/rank1``, ``health/rank0/cpu``..."""

    key: str
    step: int
    value: float
    time: float  # seconds since the epoch


@dataclass(frozen=True)
class RunInfo:
    """What a tracker run is opened with."""

    name: str  # the tracker run's name: the nbdist run's
    run_id: int | None  # the run's id in the run store
    params: dict[str, Any] = field(default_factory=dict)  # options; a trial's values
    group: str = ""  # a sweep's name: its trials are grouped under it
    tags: dict[str, str] = field(default_factory=dict)
    started: float = 0.0


class Sink(Protocol):
    """One tracker. Every method runs on the sink's own thread, never the kernel's main one.
    ``handle`` is the tracker's own run once opened (an MLflow run id, a W&B run, a Comet
    experiment)."""

    handle: Any

    def open(self, run: RunInfo) -> None: ...

    def log(self, points: list[Point]) -> None: ...

    def upload(self, folder: Path) -> None:
        """Store the files of ``folder`` (a run's checkpoints) with the tracker's run."""

    def close(self, status: str, summary: Mapping[str, float], events: list[dict]) -> None: ...


def check(track: Iterable[str]) -> None:
    """Refuse a tracker whose package is not installed, in one line naming the pip command.
    Cheap: the package is found, not imported."""
    for name in track:
        _, package, pip = TRACKERS[name]
        try:
            found = importlib.util.find_spec(package) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise UsageError(f"--track {name} needs the {package} package: {pip}")


def make(name: str) -> Sink:
    """A new sink for tracker ``name`` (imports its module, not yet its library)."""
    module = importlib.import_module(f"{__package__}.{TRACKERS[name][0]}")
    return module.make()


def warning(name: str, what: str, exc: BaseException | None = None) -> str:
    """The one line a tracker's trouble gets."""
    why = ""
    if exc is not None:
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        why = f" ({type(exc).__name__}{': ' + first if first else ''})"
    return f"nbdist: warning: {name}: {what}{why}; training goes on."


class _Lane:
    """One sink's thread and queue."""

    def __init__(self, name: str, factory: Callable[[], Sink], run: RunInfo, warn: Callable):
        self.name, self.warn = name, warn
        self.jobs: deque[tuple] = deque()
        self.cv = threading.Condition()
        self.dropped = 0
        self.dead = False
        self.thread = threading.Thread(
            target=self._loop, args=(factory, run), name=f"nbdist-track-{name}", daemon=True
        )
        self.thread.start()

    def put(self, job: tuple, droppable: bool = True) -> None:
        with self.cv:
            if self.dead:
                return
            if droppable and len(self.jobs) >= QUEUE_LIMIT:
                self.jobs.popleft()  # the oldest batch goes: the tracker is too slow
                self.dropped += 1
                if self.dropped == 1:
                    self.warn(warning(self.name, "is falling behind: some updates are dropped"))
            self.jobs.append(job)
            self.cv.notify()

    def _loop(self, factory: Callable[[], Sink], run: RunInfo) -> None:
        what = "cannot start a run: this run is not tracked there"
        try:
            sink = factory()
            sink.open(run)
            what = "failed while sending: the rest of this run is not sent there"
            while True:
                with self.cv:
                    while not self.jobs:
                        self.cv.wait()
                    job = self.jobs.popleft()
                if job[0] == "log":
                    sink.log(job[1])
                else:
                    what = "failed while ending its run"
                    sink.close(*job[1:])
                    return
        except BaseException as exc:  # one warning, then this tracker is left out
            with self.cv:
                self.dead = True
                self.jobs.clear()
            self.warn(warning(self.name, what, exc))


class Fanout:
    """Feeds every sink from the kernel's main thread, which only ever appends to queues."""

    def __init__(self, sinks: Mapping[str, Callable[[], Sink]], run: RunInfo):
        self._warnings: deque[str] = deque(maxlen=50)
        self.lanes = [_Lane(n, f, run, self._warnings.append) for n, f in sinks.items()]

    def log(self, points: list[Point]) -> None:
        if points:
            for lane in self.lanes:
                lane.put(("log", points))

    def close(self, status: str, summary: Mapping[str, float], events: list[dict]) -> None:
        """End every tracker run; wait for them up to ``CLOSE_WAIT`` s in all."""
        for lane in self.lanes:
            lane.put(("close", status, dict(summary), events), droppable=False)
        deadline = time.monotonic() + CLOSE_WAIT
        for lane in self.lanes:
            lane.thread.join(max(0.0, deadline - time.monotonic()))
            if lane.thread.is_alive():
                self._warnings.append(
                    warning(lane.name, f"still sending after {CLOSE_WAIT:.0f} s: left to finish")
                )

    def take_warnings(self) -> list[str]:
        out = []
        while self._warnings:
            out.append(self._warnings.popleft())
        return out
