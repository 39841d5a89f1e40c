"""Training throughput: the same loop in a ``%%distributed`` cell and under ``torchrun``.

nbdist's side drives a real IPython kernel (``%load_ext nbdist``, ``%nbdist start``, then
``%%distributed`` cells), not ``Cluster.run`` in this process: what a person pays for includes
the kernel's own work while the cell runs (the supervisor's polling, output forwarding, the
dashboard), and that work competes for the same cores as the ranks. The baseline is
``torchrun --nproc-per-node 2`` running ``benchmarks/workloads.py``, the file whose ``train()``
the cell calls. Both sides use 2 workers (``workers=``; ``bench_cuda`` asks for one per GPU) with
an equal share of the cores each, and only one side runs at a time (the cluster is stopped while
torchrun runs). nbdist runs each model twice: bare
(``--no-dashboard``, no reports) and with ``nbdist.report()`` every step under the live
dashboard; the target is torchrun's throughput or better, both ways. Repeats alternate which
side goes first; the figures are medians, and the note gives each side's spread (max - min over
median) so a noisy machine shows, and the median of the repeats' own ratios (each against the
torchrun run beside it, seconds apart: on a VM whose CPUs speed up and slow down by 20 % over
minutes, the steadier figure).
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace

from . import Result, threads_each
from ._kernel import ROOT, Kernel
from .workloads import MODELS

#: Workers per side: two on a CPU machine; ``bench_cuda`` asks for one per GPU.
WORKERS = 2


@dataclass(frozen=True)
class Sizes:
    """How big and how long; ``TINY`` only checks that everything runs."""

    steps: int = 100
    warmup: int = 5
    repeats: int = 7
    mlp: tuple[int, int] = (128, 1024)  # batch per rank, hidden width
    cnn: tuple[int, int] = (64, 256)


FULL = Sizes()
TINY = Sizes(steps=2, warmup=1, repeats=1, mlp=(8, 32), cnn=(4, 32))


def threads_per_worker(workers: int = WORKERS) -> int:
    """An equal share of this machine's cores each, so the workers fill it without
    oversubscribing."""
    return threads_each(workers)


def reporting_available() -> bool:
    """True once ``nbdist.report`` exists (built by the dashboard's issue)."""
    import nbdist

    return "report" in nbdist._PUBLIC and bool(
        importlib.util.find_spec("nbdist.worker.reporting.calls")
    )


def _args(model: str, s: Sizes, threads: int) -> dict:
    batch, hidden = getattr(s, model)
    return dict(model=model, steps=s.steps, warmup=s.warmup, batch=batch, hidden=hidden,
                threads=threads)  # fmt: skip


def dashboard_available() -> bool:
    """True when ``%%distributed`` shows the live dashboard (and ``--no-dashboard`` hides it)."""
    from nbdist.notebook import magics

    return "--no-dashboard" in magics._distributed_parser().format_usage()


def _cell(args: dict, report: bool) -> str:
    """The cell: bare (no dashboard, no reports), or reporting every step under the dashboard."""
    quiet = "" if report or not dashboard_available() else " --no-dashboard"
    return (
        f"%%distributed{quiet}\n"
        f"import sys\nif {str(ROOT)!r} not in sys.path: sys.path.insert(0, {str(ROOT)!r})\n"
        "from benchmarks import workloads\n"
        f"workloads.train(**{args!r}, report={report})\n"
    )


def torchrun(runs: dict[str, dict], timeout: float, workers: int = WORKERS) -> dict[str, dict]:
    """Every model in ``runs`` ({model: train() arguments}) in one torchrun launch, in order;
    rank 0's figures by model (the baseline of this benchmark and of ``bench_report``)."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={workers}", str(ROOT / "benchmarks" / "workloads.py"),
        "--config", json.dumps({m: {k: v for k, v in a.items() if k != "model"}
                                for m, a in runs.items()}),
    ]  # fmt: skip
    threads = next(iter(runs.values()))["threads"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    out = {}
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            figures = json.loads(line[len("RESULT ") :])
            out[figures["model"]] = figures
    if set(out) != set(runs):
        raise RuntimeError(f"torchrun gave no result (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return out


def _spread(xs: list[float]) -> str:
    """(max - min) / median of repeated measurements, as a percentage: how noisy the run was."""
    return f"{100 * (max(xs) - min(xs)) / statistics.median(xs):.0f}%"


def _paired(ours: list[float], theirs: list[float]) -> float:
    """The median of each repeat's ratio, ours over the baseline run in the same repeat."""
    return statistics.median(a / b for a, b in zip(ours, theirs, strict=True))


def run(tiny: bool = False, workers: int = WORKERS, start: str = "", **sizes) -> list[Result]:
    """Measure samples/s both ways, for each model, with ``workers`` ranks a side (one per GPU
    where there are GPUs: NCCL on both sides); ``start``: more ``%nbdist start`` options;
    ``sizes`` override fields of ``Sizes``."""
    s = replace(TINY if tiny else FULL, **sizes)
    threads = threads_per_worker(workers)
    variants = ["plain"] + (["report"] if reporting_available() else [])
    got: dict[tuple[str, str], list[float]] = {}

    def note(key, figures: dict) -> None:
        got.setdefault(key, []).append(figures["samples_per_s"])

    with (
        tempfile.TemporaryDirectory(prefix="nbdist-bench-") as tmp,
        Kernel({"NBDIST_DATA_DIR": tmp}) as k,
    ):
        k.run("%load_ext nbdist")

        def nbdist_side() -> None:
            k.run(f"%nbdist start -n {workers} --threads {threads} {start}")
            try:
                for model in MODELS:
                    for v in variants:
                        note((model, v), k.value(_cell(_args(model, s, threads), v == "report")))
            finally:
                k.run("%nbdist stop")

        def torchrun_side() -> None:
            figures = torchrun({m: _args(m, s, threads) for m in MODELS}, 600, workers)
            for model in MODELS:
                note((model, "torchrun"), figures[model])

        for i in range(s.repeats):
            sides = (nbdist_side, torchrun_side) if i % 2 == 0 else (torchrun_side, nbdist_side)
            for side in sides:
                side()

    results = []
    for model in MODELS:
        base = statistics.median(got[(model, "torchrun")])
        base_spread = _spread(got[(model, "torchrun")])
        for v in variants:
            label = "" if v == "plain" else " +report"
            if v == "report" and dashboard_available():
                label += " +dashboard"
            results.append(
                Result(
                    f"train {model}{label}: %%distributed / torchrun",
                    statistics.median(got[(model, v)]),
                    base,
                    "samples/s",
                    ">= 1.00",
                    note=f"(paired {_paired(got[(model, v)], got[(model, 'torchrun')]):.3f}; "
                    f"spread {_spread(got[(model, v)])} vs {base_spread})",
                )
            )
        if "report" not in variants:
            results.append(
                Result(
                    f"train {model} +report: %%distributed / torchrun",
                    float("nan"),
                    base,
                    "samples/s",
                    "",
                    note="skipped: nbdist.report not available",
                )
            )
    return results


if __name__ == "__main__":
    from . import table

    print(table(run(tiny="--tiny" in sys.argv)))
