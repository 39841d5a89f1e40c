"""The kernel's CPU over a short cell: what watching a run costs the notebook it runs in.

One kernel, driven as a front end drives it. The cell trains for 3 s on 2 engines, reporting
every 10 ms: as a ``%%distributed`` cell under the live dashboard (its final picture included),
then with ``--no-dashboard`` (the run store only); the baseline is the same loop, without the
reports, sent by ``DirectView.execute`` to a plain ``ipyparallel.Cluster(n=2)`` from the same
kernel, the least a cluster cell can cost it. Each figure is the kernel's CPU (every thread of its
process, from ``/proc``) over the cell's wall time, as a share of one core: the median of the
repeats, after one cell each that pays the imports.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, replace

from . import Result, private_data_dir
from ._kernel import Kernel, cpu_seconds

_LOOP = """import time
t0 = time.time(); i = 0
while time.time() - t0 < {seconds}:
    {report}i += 1; time.sleep(0.01)
"""
_REPORT = "nbdist.report(step=i, loss=1.0 / (i + 1), samples=32); "


@dataclass(frozen=True)
class Sizes:
    seconds: float = 3.0
    repeats: int = 4


FULL = Sizes()
TINY = Sizes(seconds=0.3, repeats=1)


def _share(k: Kernel, code: str) -> float:
    """The kernel's CPU over one cell, as a share of a core."""

    def used() -> float:
        return sum(s for _, s in cpu_seconds([], [k.pid])["threads"][k.pid].values())

    before, t0 = used(), time.monotonic()
    k.run(code)
    return (used() - before) / (time.monotonic() - t0)


def _median_share(k: Kernel, code: str, repeats: int) -> float:
    k.run(code)  # the imports (the picture's, the widget's) are paid once, not per cell
    return statistics.median(_share(k, code) for _ in range(repeats))


def run(tiny: bool = False, **sizes) -> list[Result]:
    s = replace(TINY if tiny else FULL, **sizes)
    loop = _LOOP.format(seconds=s.seconds, report=_REPORT)
    bare = _LOOP.format(seconds=s.seconds, report="")
    with private_data_dir("nbdist-bench-") as tmp, Kernel({"NBDIST_DATA_DIR": tmp}) as k:
        k.run(
            "import ipyparallel as _ipp\n"
            "_ipc = _ipp.Cluster(n=2, log_level=40)\n"
            "_rc = _ipc.start_and_connect_sync()\n"
            "_rc.wait_for_engines(2)"
        )
        base = _median_share(k, f"_rc[:].execute({bare!r}, block=True)", s.repeats)
        k.run("_rc.close(); _ipc.stop_cluster_sync()")
        k.run("%load_ext nbdist")
        k.run("%nbdist start -n 2")
        try:
            board = _median_share(k, "%%distributed\n" + loop, s.repeats)
            quiet = _median_share(k, "%%distributed --no-dashboard\n" + loop, s.repeats)
        finally:
            k.run("%nbdist stop")
    what = f"the kernel's CPU over a {s.seconds:g} s cell reporting every 10 ms"
    return [
        Result(
            f"{what}, live dashboard: nbdist / ipyparallel execute",
            100 * board,
            100 * base,
            "% core",
            note=f"goal <= 2 % of a core: {'met' if board <= 0.02 else 'MISSED'}",
        ),
        Result(
            f"{what}, --no-dashboard: nbdist / ipyparallel execute",
            100 * quiet,
            100 * base,
            "% core",
        ),  # fmt: skip
    ]


if __name__ == "__main__":
    from . import table

    print(table(run(tiny="--tiny" in sys.argv)))
