"""What a kernel keeps as it runs cells: its memory (RSS) after 1,000 small cells on 2 ranks,
against plain ipyparallel running the same cells, each in a kernel of its own, in the same run.

Each cell prints three lines on every rank and returns a small value: ``%%distributed`` on a
``%nbdist start -n 2`` cluster, and (the baseline) ``view.apply_async`` of the same code on an
``ipyparallel.Cluster(n=2)``, its value read and its output shown (``display_outputs``). Both
kernels load nbdist, so they start from the same imports. The figures: how much the kernel's RSS
grew over the cells (after a few to warm up), and its RSS at the end, garbage collected first;
then what one more cell, whose rank 1 prints 50 MB, leaves in the kernel once it has ended (the
baseline keeps its AsyncResult, as ``ar = view.apply_async(...)`` does). A kernel that kept
something of every cell (its output, its value's text, the client's records of its tasks)
would grow with them.

``python -m benchmarks --only memory``.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass, replace

import psutil

from . import Result
from ._kernel import Kernel


@dataclass(frozen=True)
class Sizes:
    cells: int = 1000
    warmup: int = 20
    ranks: int = 2
    printed_mb: int = 50  # what one rank prints in the last cell


FULL = Sizes()
TINY = Sizes(cells=20, warmup=3, printed_mb=5)

_NBDIST_START = "%nbdist start -n {ranks}"
_NBDIST_CELL = """%%distributed
for i in range(3):
    print(f"rank {nbdist.rank()}: line {i} of a small cell")
{"rank": nbdist.rank(), "values": list(range(20))}
"""
_NBDIST_LOUD = """%%distributed
import sys
if nbdist.rank() == 1:
    for _ in range({mb}):
        sys.stdout.write(("x" * 999 + "\\n") * 1000)
1
"""
_NBDIST_STOP = "%nbdist stop"

_BASELINE_START = """
import ipyparallel as ipp

def _cell():
    import os
    for i in range(3):
        print(f"engine {os.getpid()}: line {i} of a small cell")
    return {"rank": 0, "values": list(range(20))}

_cluster = ipp.Cluster(n={ranks})
_rc = _cluster.start_and_connect_sync()
_rc.wait_for_engines({ranks})
_view = _rc[:]
"""
_BASELINE_CELL = """_ar = _view.apply_async(_cell)
_values = _ar.get()
_ar.display_outputs()
_values[0]
"""
_BASELINE_LOUD = """def _loud(mb):
    import sys
    for _ in range(mb):
        sys.stdout.write(("x" * 999 + "\\n") * 1000)
    return 1

_ar = _rc[_rc.ids[1]].apply_async(_loud, {mb})
_values = _ar.get()
_values
"""
_BASELINE_STOP = "_rc.close()\n_cluster.stop_cluster_sync()"

_COLLECT = "import gc as _gc\n_gc.collect()\nNone"


def _rss_mb(k: Kernel) -> float:
    k.run(_COLLECT)
    return psutil.Process(k.pid).memory_info().rss / 1e6


def _side(start: str, cell: str, loud: str, stop: str, s: Sizes, tmp: str) -> list[float]:
    """RSS growth over the cells, RSS at the end, and what the loud cell left, in MB, in a
    kernel of its own."""
    env = {"NBDIST_DATA_DIR": tmp, "IPYTHONDIR": tmp + "/ipython"}
    with Kernel(env) as k:
        k.run("%load_ext nbdist")
        k.run(start.replace("{ranks}", str(s.ranks)), timeout=300)
        for _ in range(s.warmup):
            k.run(cell)
        before = _rss_mb(k)
        for _ in range(s.cells):
            k.run(cell)
        after = _rss_mb(k)
        k.run(loud.replace("{mb}", str(s.printed_mb)), timeout=300)
        kept = _rss_mb(k) - after
        k.run(stop, timeout=120)
    return [after - before, after, kept]


def run(tiny: bool = False, **sizes) -> list[Result]:
    s = replace(TINY if tiny else FULL, **sizes)
    with tempfile.TemporaryDirectory(prefix="nbdist-bench-") as tmp:
        grew, rss, kept = _side(_NBDIST_START, _NBDIST_CELL, _NBDIST_LOUD, _NBDIST_STOP, s, tmp)
        base_grew, base_rss, base_kept = _side(
            _BASELINE_START, _BASELINE_CELL, _BASELINE_LOUD, _BASELINE_STOP, s, tmp
        )
    what = f"{s.cells} small cells on {s.ranks} ranks"
    return [
        Result(
            f"kernel RSS growth, {what}: %%distributed / ipyparallel apply",
            grew,
            base_grew,
            "MB",
            note=f"({grew * 1000 / s.cells:.1f} KB per cell)",
        ),
        Result(f"kernel RSS after {what}: %%distributed / ipyparallel apply", rss, base_rss, "MB"),
        Result(
            f"kernel RSS kept after a cell whose rank 1 printed {s.printed_mb} MB: "
            "%%distributed / ipyparallel apply",
            kept,
            base_kept,
            "MB",
        ),
    ]


if __name__ == "__main__":
    from . import table

    print(table(run(tiny="--tiny" in sys.argv)))
