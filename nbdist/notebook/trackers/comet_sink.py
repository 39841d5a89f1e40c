"""Comet: one Comet experiment per nbdist run, configured as Comet configures itself (its
config file, ``COMET_API_KEY``, ``COMET_PROJECT_NAME``, ``COMET_WORKSPACE``; offline with
``COMET_START_ONLINE=false`` and ``COMET_OFFLINE_DIRECTORY``), through ``comet_ml.start``.

Nothing is logged behind nbdist's back (no console, code, git, environment or auto-logging): the
points nbdist sends, the run's options as parameters, a sweep's trials tagged ``sweep:NAME``, the
events as a text asset (``nbdist-events.jsonl``).
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

from .sinks import Point, RunInfo

_starting = threading.Lock()  # one Comet experiment starting at a time


def make() -> CometSink:
    return CometSink()


class CometSink:
    def __init__(self) -> None:
        import comet_ml  # here: only on the sink's thread
        import comet_ml.config

        self.comet = comet_ml
        self.exp = None

    def open(self, run: RunInfo) -> None:
        tags = ["nbdist"] + (
            [f"sweep:{run.group}", f"trial:{run.tags['nbdist.trial']}"] if run.group else []
        )
        off = dict.fromkeys(
            ("log_code", "log_graph", "parse_args", "log_git_metadata", "log_git_patch",
             "log_env_details", "log_env_gpu", "log_env_host", "log_env_cpu", "log_env_network",
             "log_env_disk", "auto_param_logging", "auto_metric_logging", "auto_log_co2"),
            False,
        )  # fmt: skip
        config = self.comet.ExperimentConfig(
            name=run.name, tags=tags, display_summary_level=0, auto_output_logging=False, **off
        )
        # Comet ends the process's running experiment when it starts another; a sweep's trials
        # run side by side in this kernel, so each starts with none running (under a lock).
        with _starting:
            self.comet.config.set_global_experiment(None)
            self.exp = self.comet.start(mode="create", experiment_config=config)
        self.handle = self.exp
        self.exp.log_parameters(dict(run.params))
        self.exp.log_others({k: v for k, v in run.tags.items()})

    def log(self, points: list[Point]) -> None:
        rows: dict[int, dict] = defaultdict(dict)
        for p in points:
            rows[p.step][p.key] = p.value
        for step in sorted(rows):
            self.exp.log_metrics(rows[step], step=step)

    def upload(self, folder: Path) -> None:
        self.exp.log_asset_folder(str(folder), log_file_name=True, recursive=True)

    def close(self, status: str, summary: Mapping[str, float], events: list[dict]) -> None:
        exp = self.exp
        exp.log_other("nbdist.status", status)
        exp.log_others({f"summary/{k}": v for k, v in summary.items()})
        if events:
            text = "".join(json.dumps(e, default=str) + "\n" for e in events)
            exp.log_asset_data(text, name="nbdist-events.jsonl")
        exp.end()
