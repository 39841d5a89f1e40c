"""What looking inside a run costs, each against the same cell without it, in one kernel:

- ``--profile``: the step time of the report benchmark's loop (``workloads.train``, a ~3 ms DDP
  step with ``report()``) profiled, and then again without it (nothing must linger), against
  the same loop before;
- stacks at a stop: a cell stopped by ``--timeout`` while its ranks sleep, from the timeout to
  the end of the cell, with the ranks' stacks shown and (the baseline) with that step left out,
  on 2 and on 8 ranks;
- output rewritten in place: the kernel's CPU while rank 0 redraws a ``\\r`` progress line
  about 2,000 times a second, flushed ten times a second as tqdm does (what the notebook shows
  is updated four times a second), against a cell that prints nothing for as long.

``python -m benchmarks --only debug``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import dataclass, replace

import psutil

from . import Result
from ._kernel import ROOT, Kernel
from .bench_train import threads_per_worker


@dataclass(frozen=True)
class Sizes:
    steps: int = 300
    warmup: int = 20
    batch: int = 64
    hidden: int = 256
    rounds: int = 3  # of plain / profiled / plain again
    redraw_s: float = 5.0
    timeout_s: float = 2.0
    many: int = 8  # ranks of the larger stop


FULL = Sizes()
TINY = Sizes(steps=5, warmup=1, batch=8, hidden=16, rounds=1, redraw_s=0.5, timeout_s=1.0, many=2)

_TRAIN = """%%distributed --no-dashboard{flags}
import sys
if {root!r} not in sys.path: sys.path.insert(0, {root!r})
from benchmarks import workloads
workloads.train(model="mlp", steps={steps}, warmup={warmup}, batch={batch}, hidden={hidden},
                threads={threads}, report=True)["step_ms"]
"""
_SLEEP = "%%distributed --no-dashboard\nimport time\ntime.sleep({s})\n"
_REDRAW = """%%distributed --no-dashboard
import sys, time
t_end, i, flushed = time.time() + {s}, 0, 0.0
while time.time() < t_end:
    if nbdist.rank() == 0:
        print(f"\\rbatch {{i}}", end="")
        if time.time() - flushed > 0.1:  # as tqdm does: it flushes each redraw, ten a second
            sys.stdout.flush()
            flushed = time.time()
    i += 1
    time.sleep(0.0005)
print()
"""
_STOPPED = "%%distributed --timeout {t}\nimport time\ntime.sleep(60)\n"
_NO_STACKS = """from nbdist.notebook.run import supervisor as _sup
_sup.CellRun._show_where, _kept = (lambda self, ranks, why: None), _sup.CellRun._show_where
"""
_STACKS_BACK = "_sup.CellRun._show_where = _kept\n"


def _step_ms(k: Kernel, s: Sizes, flags: str) -> float:
    cell = _TRAIN.format(flags=flags, root=str(ROOT), steps=s.steps, warmup=s.warmup,
                         batch=s.batch, hidden=s.hidden, threads=threads_per_worker())  # fmt: skip
    return float(k.value(cell))


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def _kernel_cpu(k: Kernel, cell: str) -> tuple[float, float]:
    """(kernel CPU seconds, wall seconds) over one cell."""
    proc = psutil.Process(k.pid)
    c0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
    k.run(cell)
    return sum(proc.cpu_times()[:2]) - c0, time.monotonic() - t0


def _stop_seconds(k: Kernel, timeout: float) -> float:
    """From the cell's timeout to its end (the error shown)."""
    t0 = time.monotonic()
    try:
        k.run(_STOPPED.format(t=timeout))
    except Exception:  # the cell fails, as it must
        pass
    return time.monotonic() - t0 - timeout


def run(tiny: bool = False, **sizes) -> list[Result]:
    s = replace(TINY if tiny else FULL, **sizes)
    out: list[Result] = []
    with (
        tempfile.TemporaryDirectory(prefix="nbdist-bench-") as tmp,
        Kernel({"NBDIST_DATA_DIR": tmp}) as k,
    ):
        k.run("%load_ext nbdist")
        k.run(f"%nbdist start -n 2 --threads {threads_per_worker()}")
        _step_ms(k, s, "")  # warm: the engines' first DDP model
        plain, profiled, after = [], [], []
        for _ in range(s.rounds):
            plain.append(_step_ms(k, s, ""))
            profiled.append(_step_ms(k, s, " --profile"))
            after.append(_step_ms(k, s, ""))
        med = _median(plain)
        out += [
            Result("--profile: step time while profiling / without", _median(profiled), med,
                   "ms/step"),
            Result("--profile: step time in the next cell / before", _median(after), med,
                   "ms/step", "<= 1.05"),
        ]  # fmt: skip
        quiet = _kernel_cpu(k, _SLEEP.format(s=s.redraw_s))
        redraw = _kernel_cpu(k, _REDRAW.format(s=s.redraw_s))
        out.append(
            Result(
                "kernel CPU: rank 0 redrawing a \\r line / printing nothing",
                100 * redraw[0] / redraw[1],
                100 * quiet[0] / quiet[1],
                "% core",
                note="(shown in place four times a second)",
            )
        )
        k.run("%nbdist stop")
        for n in (2, s.many):
            k.run(f"%nbdist start -n {n} --threads 1 --oversubscribe")
            shown = _stop_seconds(k, s.timeout_s)
            k.run(_NO_STACKS)
            bare = _stop_seconds(k, s.timeout_s)
            k.run(_STACKS_BACK)
            k.run("%nbdist stop")
            out.append(
                Result(
                    f"a stop, {n} ranks: with their stacks / without",
                    shown,
                    bare,
                    "s",
                    note="(from the timeout to the error shown)",
                )  # fmt: skip
            )
    return out


if __name__ == "__main__":
    from . import table

    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    print(table(run(tiny="--tiny" in sys.argv)))
