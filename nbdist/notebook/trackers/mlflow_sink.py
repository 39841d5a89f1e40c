"""MLflow: one MLflow run per nbdist run, through ``MlflowClient`` (no global active run, so a
person's own ``mlflow.start_run()`` is left alone).

Configured as MLflow configures itself: ``MLFLOW_TRACKING_URI`` (or MLflow's default),
``MLFLOW_EXPERIMENT_NAME`` or ``MLFLOW_EXPERIMENT_ID`` (default: the Default experiment). A
sweep's trials are nested under one parent run named for the sweep (MLflow's
``mlflow.parentRunId`` tag), ended when its last running trial ends.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .sinks import Point, RunInfo

STATUS = {"ok": "FINISHED", "failed": "FAILED"}  # interrupted, stopped: KILLED
_BATCH = 1000  # MLflow's limit on metrics per log_batch
_PARAMS = 100  # and on params
_parents: dict[tuple, list] = {}  # (uri, experiment, sweep) -> [parent run id, running trials]
_lock = threading.Lock()


def make() -> MlflowSink:
    return MlflowSink()


def key(text: str) -> str:
    """A name MLflow takes (letters, digits, _ - . space /)."""
    return re.sub(r"[^\w\-. /]", "_", text)[:250]


class MlflowSink:
    def __init__(self) -> None:
        from mlflow.tracking import MlflowClient  # here: only on the sink's thread

        self.client = MlflowClient()
        self.run_id = ""
        self._parent: tuple | None = None

    def _experiment(self) -> str:
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME")
        if name:
            exp = self.client.get_experiment_by_name(name)
            return exp.experiment_id if exp else self.client.create_experiment(name)
        return os.environ.get("MLFLOW_EXPERIMENT_ID") or "0"

    def open(self, run: RunInfo) -> None:
        from mlflow.entities import Param

        exp = self._experiment()
        tags = {**run.tags, "mlflow.runName": run.name, "mlflow.source.name": "nbdist"}
        if run.group:
            tags["mlflow.parentRunId"] = self._join(exp, run.group)
        self.run_id = self.client.create_run(exp, tags=tags, run_name=run.name).info.run_id
        self.handle = self.run_id
        params = [Param(key(k), str(v)[:6000]) for k, v in run.params.items()]
        for i in range(0, len(params), _PARAMS):
            self.client.log_batch(self.run_id, params=params[i : i + _PARAMS])

    def _join(self, exp: str, group: str) -> str:
        """The sweep's parent run (made by its first trial), one more trial running in it."""
        self._parent = (self.client.tracking_uri, exp, group)
        with _lock:
            entry = _parents.get(self._parent)
            if entry is None:
                parent = self.client.create_run(exp, run_name=group, tags={"nbdist.sweep": group})
                entry = _parents[self._parent] = [parent.info.run_id, 0]
            elif entry[1] == 0:
                self.client.update_run(entry[0], status="RUNNING")
            entry[1] += 1
            return entry[0]

    def log(self, points: list[Point]) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(key(p.key), p.value, int(p.time * 1000), p.step) for p in points]
        for i in range(0, len(metrics), _BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + _BATCH])

    def upload(self, folder: Path) -> None:
        self.client.log_artifacts(self.run_id, str(folder), "checkpoints")

    def close(self, status: str, summary: Mapping[str, float], events: list[dict]) -> None:
        c, now = self.client, int(time.time() * 1000)
        c.set_tag(self.run_id, "nbdist.status", status)
        if events:
            text = "\n".join(json.dumps(e, default=str) for e in events)
            c.log_text(self.run_id, text + "\n", "nbdist/events.jsonl")
        self.log([Point(f"summary/{k}", 0, v, now / 1000) for k, v in summary.items()])
        c.set_terminated(self.run_id, STATUS.get(status, "KILLED"), now)
        if self._parent is not None:
            with _lock:
                entry: Any = _parents.get(self._parent)
                entry[1] -= 1
                if entry[1] == 0:
                    c.set_terminated(entry[0], "FINISHED", now)
