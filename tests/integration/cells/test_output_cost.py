"""A rank's printed output costs the kernel the same at the end of a long cell as at its start:
ranks redraw a tqdm bar, put megabytes of log lines on the bar's stream, and redraw it again;
the kernel's CPU over the second bar is that of the first, and what it holds of the ranks'
streams stays bounded (ipyparallel's client alone held all of it, and ran its regex over all of
it at every redraw: the second bar cost 35 s of CPU, not 1)."""

from __future__ import annotations

import threading
import time

import psutil
import pytest

from nbdist.config import CellOptions
from nbdist.notebook.cluster.streams import HELD_MOST
from nbdist.notebook.run import programs

pytest.importorskip("tqdm")

BAR_S = 3.0  # seconds of each bar
DUMP_MB = 5  # log lines each rank puts on the bar's stream between the two bars

CELL = f"""
import sys, time
from tqdm.auto import tqdm

def bar(seconds):
    t0 = time.time()
    with tqdm(total=10**9, mininterval=0, ncols=100) as b:  # on stderr, redrawn every step
        while time.time() - t0 < seconds:
            b.update(1)
            time.sleep(0.001)
    return t0, time.time()

first = bar({BAR_S})
line = "log " + "y" * 195 + "\\n"
sys.stderr.write(line * {DUMP_MB * 5000})
second = bar({BAR_S})
first, second
"""


def _held(client) -> int:
    """Characters the client's records of running requests hold of their streams."""
    most = 0
    for md in list(client.metadata.values()):
        if not isinstance(md, dict):  # the client keeps a date there too ("submitted")
            continue
        held = getattr(md, "held", None)
        size = held() if held else sum(len(dict.get(md, n) or "") for n in ("stdout", "stderr"))
        most = max(most, size)
    return most


def test_a_bar_costs_the_kernel_the_same_after_megabytes_on_its_stream(cluster, no_front_end):
    me = psutil.Process()
    samples: list[tuple[float, float, int]] = []  # (time, the kernel's CPU s, most held)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            cpu = me.cpu_times()
            samples.append((time.time(), cpu.user + cpu.system, _held(cluster.client)))
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        opts = CellOptions(dashboard=False, name="bar, log, bar")
        (a0, a1), (c0, _) = programs.run_watched(cluster, programs.cell(CELL), opts)
    finally:
        done.set()
        sampler.join()
    ended = samples[-1]

    def cpu_at(t: float) -> float:
        return min(samples, key=lambda s: abs(s[0] - t))[1]

    first = cpu_at(a1) - cpu_at(a0)
    second = ended[1] - cpu_at(c0)  # until the cell ended: all its output read
    assert second < 2 * first + 1.0, (first, second)
    most = max(s[2] for s in samples)
    assert most <= HELD_MOST < DUMP_MB * 1_000_000, (
        f"the client held {most:,} characters of a rank's streams"
    )
