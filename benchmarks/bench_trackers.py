"""Experiment trackers: the kernel's CPU over one reporting cell with each tracker on, against none.

One real kernel, one 2-rank cluster. The cell reports for ``seconds`` (30 s) on both ranks, every
10 ms, the loss and four more metrics (about 200 report() calls a second in all), under
``--no-dashboard`` so that only the run store and the trackers watch it. It runs once with no
tracker, once with each of ``--track mlflow`` (MLflow's local file store), ``--track wandb``
(``WANDB_MODE=offline``) and ``--track comet`` (Comet's offline experiment), and once more with
none (the A/A pair gives the noise floor); before them, one short cell with all three pays the
libraries' imports, which are not counted.

The figure is the kernel process's CPU (user + system, psutil) over the cell, in % of one core
of the reporting time, against the mean of the two runs without a tracker. The note gives what
the tracker's helper processes took besides (W&B's ``wandb-core``: every process the kernel
started during the runs, not the cluster's), the A/A figure and the cell's wall time (which
includes the end of the tracker run). Everything is written under a temporary folder; nothing
reaches the network.

    python -m benchmarks --only trackers      # or: python -m benchmarks.bench_trackers
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time

import psutil

from . import Result, private_data_dir
from ._kernel import Kernel, cpu_total

TRACKERS = ("mlflow", "wandb", "comet")
_PACKAGES = {"mlflow": "mlflow", "wandb": "wandb", "comet": "comet_ml"}

_CELL = """%%distributed --no-dashboard {flags} --name bench-{label}
import time
t_end = time.time() + {seconds}
i = 0
while time.time() < t_end:
    nbdist.report(step=i, loss=1.0 / (i + 1), samples=32, acc=i % 100 / 100, lr=0.1,
                  grad_norm=1.0 + i % 7, tokens=64.0)
    i += 1
    time.sleep(0.01)
i
"""


def _env(root: str) -> dict[str, str]:
    """Every tracker local or offline, under ``root``; none may reach the network."""
    os.makedirs(f"{root}/wandb", exist_ok=True)
    return {
        "MLFLOW_TRACKING_URI": f"file:{root}/mlruns",
        "MLFLOW_ALLOW_FILE_STORE": "true",
        "WANDB_MODE": "offline",
        "WANDB_DIR": f"{root}/wandb",
        "WANDB_SILENT": "true",
        "WANDB_ERROR_REPORTING": "false",
        "WANDB_PROJECT": "nbdist-bench",
        "COMET_START_ONLINE": "false",
        "COMET_OFFLINE_DIRECTORY": f"{root}/comet",
        "COMET_ERROR_TRACKING_ENABLE": "false",
        "COMET_PROJECT_NAME": "nbdist-bench",
    }


def _measure(k: Kernel, flags: str, label: str, seconds: float, cluster: set[int]) -> dict:
    """One cell: the kernel's CPU seconds, its helpers' (not the cluster's), the wall time."""
    kernel = psutil.Process(k.pid)
    helpers = [p for p in k.descendants() if p.pid not in cluster]
    before = (cpu_total([kernel]), {p.pid: cpu_total([p]) for p in helpers})
    t0 = time.monotonic()
    steps = k.value(_CELL.format(flags=flags, label=label, seconds=seconds), timeout=seconds + 300)
    wall = time.monotonic() - t0
    helpers = [p for p in k.descendants() if p.pid not in cluster]
    helper_cpu = sum(cpu_total([p]) - before[1].get(p.pid, 0.0) for p in helpers)
    return {
        "kernel": 100 * (cpu_total([kernel]) - before[0]) / seconds,
        "helpers": 100 * helper_cpu / seconds,
        "wall": wall,
        "steps": steps,
    }


def run(tiny: bool = False, seconds: float | None = None) -> list[Result]:
    """The kernel's CPU over a reporting cell: each tracker / none."""
    missing = [t for t in TRACKERS if importlib.util.find_spec(_PACKAGES[t]) is None]
    trackers = [t for t in TRACKERS if t not in missing]
    seconds = seconds or (1.0 if tiny else 30.0)
    with private_data_dir("nbdist-bench-trackers-"), tempfile.TemporaryDirectory() as root:
        k = Kernel(env=_env(root))
        try:
            k.run("%load_ext nbdist\n%nbdist start -n 2")
            cluster = {p.pid for p in k.descendants()}
            if trackers:  # the libraries' imports and first runs: not counted
                k.value(_CELL.format(flags="--track " + ",".join(trackers), label="warm",
                                     seconds=0.5))  # fmt: skip
            got = {"none": _measure(k, "", "none", seconds, cluster)}
            for t in trackers:
                got[t] = _measure(k, f"--track {t}", t, seconds, cluster)
            got["none (A/A)"] = _measure(k, "", "none-aa", seconds, cluster)
            k.run("%nbdist stop")
        finally:
            k.shutdown()
    base = (got["none"]["kernel"] + got["none (A/A)"]["kernel"]) / 2
    aa = got["none (A/A)"]
    results = [
        Result(
            f"kernel CPU, {seconds:.0f} s reporting cell: --track {t} / none",
            got[t]["kernel"],
            base,
            "% core",
            note=f"(helper processes {got[t]['helpers']:.1f}% core; cell {got[t]['wall']:.1f} s "
            f"for {seconds:.0f} s of reports, {got[t]['steps']} steps a rank; A/A none "
            f"{aa['kernel']:.1f}% vs {got['none']['kernel']:.1f}%)",
        )
        for t in trackers
    ]
    if missing:
        results.append(
            Result(f"trackers not installed, not measured: {', '.join(missing)}", 0.0, 1.0)
        )
    return results


if __name__ == "__main__":
    from . import table

    print(table(run(tiny="--tiny" in sys.argv)))
