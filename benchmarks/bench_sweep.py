"""Sweeps: 4 learning rates as a sweep of 1-rank trials, against 4 DDP runs one after another.

One training cell (an MLP on generated data, ``nbdist.prepare``, SGD at ``lr``, ``steps`` steps,
``nbdist.report`` every step; the global batch split over the ranks of whatever group runs it)
is run for 4 learning rates on one 2-engine cluster (cores/2 threads per engine), two ways:

- **sweep**: ``sweep(cell, {"lr": [...]}, trial_size=1)``: each trial on one rank, two at once,
  each rank taking the whole global batch (no all-reduce, no waiting for the other rank);
- **one after another** (the baseline): ``cluster.run(f"lr = {lr}")`` then ``cluster.run(cell)``
  for each rate: each a 2-rank DDP run, each rank taking half the global batch.

The figure is the wall time to finish all four (value: sweep, baseline: one after another;
below 1 the sweep wins), for three models: a small MLP, a tiny one run for many steps (the
per-step all-reduce and synchronisation dominate) and a bigger one (compute dominates). The
note gives the CPU seconds each side used in the engines and in this process, which drives the
runs as a kernel would (psutil, user + system), and the machine's cores. Rounds alternate which
side goes first; figures are medians.

    python -m benchmarks --only sweep      # or: python -m benchmarks.bench_sweep
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, replace

import psutil

from . import Result, cores, private_data_dir, threads_each
from ._kernel import cpu_total

WORKERS = 2
RATES = (0.1, 0.03, 0.01, 0.003)
IN, CLASSES = 32, 10


@dataclass(frozen=True)
class Model:
    """One training cell's size: an MLP of ``depth`` hidden layers of ``width``."""

    kind: str  # what dominates, for the label
    width: int
    depth: int
    batch: int  # global: a 1-rank trial's whole batch, each DDP rank's half
    steps: int

    @property
    def label(self) -> str:
        kind = f" ({self.kind})" if self.kind else ""
        return f"mlp {self.depth}x{self.width}, batch {self.batch}, {self.steps} steps{kind}"


@dataclass(frozen=True)
class Sizes:
    """The models and the rounds; ``TINY`` only checks that every path runs."""

    models: tuple[Model, ...] = (
        Model("", 256, 2, 64, 300),
        Model("communication", 16, 1, 16, 1000),
        Model("compute", 1024, 2, 1024, 30),
    )
    repeats: int = 3


FULL = Sizes()
TINY = Sizes(models=tuple(replace(m, steps=3) for m in FULL.models), repeats=1)


def cell(m: Model) -> str:
    """The training cell: ``lr`` comes from the sweep, or from an earlier cell."""
    return f"""
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
layers = [nn.Linear({IN}, {m.width}), nn.ReLU()]
for _ in range({m.depth - 1}):
    layers += [nn.Linear({m.width}, {m.width}), nn.ReLU()]
model = nbdist.prepare(nn.Sequential(*layers, nn.Linear({m.width}, {CLASSES})))
opt = torch.optim.SGD(model.parameters(), lr=lr)
g = torch.Generator().manual_seed(1)
X = torch.randn(4 * {m.batch}, {IN}, generator=g)
Y = X[:, :{CLASSES}].argmax(1)
per = {m.batch} // nbdist.world_size()
for step in range({m.steps}):
    i = (step % 4) * {m.batch} + nbdist.rank() * per
    opt.zero_grad()
    loss = F.cross_entropy(model(X[i : i + per]), Y[i : i + per])
    loss.backward()
    opt.step()
    nbdist.report(step=step, loss=loss)
"""


def _rounds(s: Sizes, threads: int) -> dict[tuple[str, str], list[tuple[float, float, float]]]:
    """Each model both ways, ``repeats`` times; per (model, side), per round: wall seconds, CPU
    seconds of the engines, CPU seconds of this process."""
    import nbdist
    from nbdist.notebook.sweeps.trials import sweep

    got: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    c = nbdist.start(n=WORKERS, threads_per_engine=threads)
    me = psutil.Process()
    n_sweeps = 0
    try:
        engines = [psutil.Process(s.pid) for s in c.slots]

        def sweep_side(m: Model) -> None:
            nonlocal n_sweeps
            n_sweeps += 1
            table = sweep(cell(m), {"lr": list(RATES)}, trial_size=1, board=False,
                          name=f"bench-{n_sweeps}")  # fmt: skip
            bad = [r for r in table if r.state != "done"]
            if bad:
                raise RuntimeError(f"sweep trials did not finish: {bad}")

        def serial_side(m: Model) -> None:
            for lr in RATES:
                c.run(f"lr = {lr}")
                c.run(cell(m))

        def timed(key: tuple[str, str], side, m: Model) -> None:
            e0, k0, t0 = cpu_total(engines), cpu_total([me]), time.perf_counter()
            side(m)
            t1 = time.perf_counter()
            got.setdefault(key, []).append((t1 - t0, cpu_total(engines) - e0, cpu_total([me]) - k0))

        warm = replace(s.models[0], steps=2)  # untimed: each engine's first run loads code
        serial_side(warm)
        sweep_side(warm)
        for i in range(s.repeats):
            for m in s.models:
                sides = (("sweep", sweep_side), ("serial", serial_side))
                for name, side in sides if i % 2 == 0 else sides[::-1]:
                    timed((m.label, name), side, m)
    finally:
        c.stop()
    return got


def run(tiny: bool = False, **sizes) -> list[Result]:
    """Wall time to train 4 learning rates: sweep of 1-rank trials / 2-rank runs in turn."""
    s = replace(TINY if tiny else FULL, **sizes)
    threads = threads_each(WORKERS)
    with private_data_dir("nbdist-bench-sweep-"):
        got = _rounds(s, threads)
    results = []
    for m in s.models:
        sw, se = got[(m.label, "sweep")], got[(m.label, "serial")]

        def med(rows: list, k: int) -> float:
            return statistics.median(r[k] for r in rows)

        results.append(
            Result(
                f"sweep {len(RATES)} lr, {m.label}: 1-rank trials / 2-rank DDP in turn",
                med(sw, 0),
                med(se, 0),
                "s",
                note=f"(CPU s engines+kernel: sweep {med(sw, 1):.3g}+{med(sw, 2):.2g}, "
                f"in turn {med(se, 1):.3g}+{med(se, 2):.2g}; {cores()} cores, "
                f"{threads} thread(s)/engine; spread {_spread([r[0] for r in sw])} vs "
                f"{_spread([r[0] for r in se])})",
            )
        )
    return results


def _spread(xs: list[float]) -> str:
    """(max - min) / median of repeated measurements, as a percentage."""
    return f"{100 * (max(xs) - min(xs)) / statistics.median(xs):.0f}%"


if __name__ == "__main__":
    from . import table

    print(table(run(tiny="--tiny" in sys.argv)))
