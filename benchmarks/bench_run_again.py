"""Stop, fix, run again: the cell after a stop, against the same cell after a cell that ended well.

A DDP model prepared in one cell and trained in the next; that cell is stopped (``--timeout``,
the interrupt the notebook's button sends, a rank's error), and the next cell trains it on: its
time against the same cell's after an uninterrupted one, measured in the same run on the same
cluster (the difference is the new formation of the group and the objects bound to it). With
``--no-shm`` too (DDP on gloo's sockets rather than shared memory).

    python -m benchmarks.bench_run_again [--repeat 3]
"""

from __future__ import annotations

import _thread
import argparse
import statistics
import threading
import time

from benchmarks import Result, table

_PREPARE = """
import torch
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 16))
model, opt = nbdist.prepare(net, torch.optim.SGD(net.parameters(), lr=0.01))
"""
_TRAIN = """
for _ in range(N):
    opt.zero_grad()
    model(torch.randn(32, 256)).pow(2).mean().backward()
    opt.step()
"""
_RAISE = "N = 5\n" + _TRAIN + "if nbdist.rank() == 1:\n    raise ValueError('a bad batch')\n"


def _next_cell(cluster) -> float:
    t0 = time.perf_counter()
    cluster.run("N = 5\n" + _TRAIN)
    return time.perf_counter() - t0


def _stop(cluster, how: str) -> None:
    from nbdist.config import CellOptions

    try:
        if how == "--timeout":
            cluster.run("N = 10**9\n" + _TRAIN, CellOptions(timeout=1.0, quiet=True))
        elif how == "interrupt":
            threading.Timer(1.0, _thread.interrupt_main).start()
            cluster.run("N = 10**9\n" + _TRAIN, CellOptions(quiet=True))
        else:
            cluster.run(_RAISE, CellOptions(quiet=True))
    except (Exception, KeyboardInterrupt):
        return
    raise AssertionError(f"the cell was not stopped by {how}")


def measure(stop: str, shm: bool, repeat: int) -> tuple[float, float]:
    """Median seconds of the next cell after ``stop``, and after a cell that ended well."""
    import nbdist

    after_stop, after_ok = [], []
    with nbdist.start(n=2, shared_memory=shm) as cluster:
        cluster.run(_PREPARE)
        cluster.run("N = 20\n" + _TRAIN)
        for _ in range(repeat):
            cluster.run("N = 20\n" + _TRAIN)
            after_ok.append(_next_cell(cluster))
            _stop(cluster, stop)
            after_stop.append(_next_cell(cluster))
    return statistics.median(after_stop), statistics.median(after_ok)


def run(tiny: bool = False, repeat: int = 3) -> list[Result]:
    repeat = 1 if tiny else repeat
    cases = [("--timeout", True)] if tiny else [
        ("--timeout", True), ("interrupt", True), ("a rank raised", True), ("--timeout", False)
    ]  # fmt: skip
    out = []
    for stop, shm in cases:
        value, baseline = measure(stop, shm, repeat)
        where = "shared memory" if shm else "--no-shm"
        out.append(
            Result(
                f"next cell after {stop} ({where}) / after a cell that ended well",
                value,
                baseline,
                "s",
            )  # fmt: skip
        )
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    print(table(run(repeat=p.parse_args(argv).repeat)))


if __name__ == "__main__":
    main()
