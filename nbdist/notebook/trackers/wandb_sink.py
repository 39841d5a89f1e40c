"""Weights & Biases: one W&B run per nbdist run, configured as W&B configures itself
(``WANDB_PROJECT``, ``WANDB_ENTITY``, ``WANDB_MODE=offline``, ``WANDB_DIR``, a login).

Each run is its own (``reinit="create_new"``), so a person's own ``wandb.init()`` is left
alone. nbdist's step is the x-axis of every chart (``define_metric``); a sweep's trials share
the sweep's name as their W&B group; the events are a file of the run (``nbdist-events.jsonl``).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

from .sinks import Point, RunInfo

STEP = "nbdist/step"


def make() -> WandbSink:
    return WandbSink()


class WandbSink:
    def __init__(self) -> None:
        import wandb  # here: only on the sink's thread

        self.wandb = wandb
        self.run = None

    def open(self, run: RunInfo) -> None:
        self.run = self.wandb.init(
            name=run.name,
            group=run.group or None,
            config=run.params,
            tags=[f"{k}={v}" for k, v in run.tags.items()][:20] or None,
            reinit="create_new",
            job_type="trial" if run.group else None,
            settings=self.wandb.Settings(console="off", save_code=False, x_disable_stats=True),
        )
        self.handle = self.run
        self.run.define_metric(STEP, hidden=True)
        self.run.define_metric("*", step_metric=STEP)

    def log(self, points: list[Point]) -> None:
        rows: dict[int, dict] = defaultdict(dict)
        for p in points:
            rows[p.step][p.key] = p.value
        for step in sorted(rows):  # one row per step: W&B's own step only goes up
            self.run.log({STEP: step, **rows[step]})

    def upload(self, folder: Path) -> None:
        artifact = self.wandb.Artifact(f"checkpoints-{self.run.id}", type="model")
        artifact.add_dir(str(folder))
        self.run.log_artifact(artifact)

    def close(self, status: str, summary: Mapping[str, float], events: list[dict]) -> None:
        run = self.run
        run.summary.update(
            {"nbdist/status": status, **{f"summary/{k}": v for k, v in summary.items()}}
        )
        if events:
            with open(os.path.join(run.dir, "nbdist-events.jsonl"), "w") as f:
                f.writelines(json.dumps(e, default=str) + "\n" for e in events)
        run.finish(exit_code=0 if status == "ok" else 1)
