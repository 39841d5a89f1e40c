"""Start-up: ``%nbdist start -n 2`` to a ready process group, against plain ipyparallel.

Each trial runs in a fresh IPython kernel (a notebook's first start pays every import), timed
inside the kernel around the one cell that starts the cluster. nbdist's cell is
``%nbdist start -n 2``, which returns with a formed, checked process group. The baseline's cell
is what a person would write by hand: ``ipyparallel.Cluster(n=2)`` with default settings,
started and connected, then a gloo process group formed on the engines (each rank told its
rank, a port chosen in the notebook) and checked with an all-reduce. Stopping is not timed.
Trials alternate sides; the figures are medians. nbdist is timed twice: its start cell run
at once after ``%load_ext nbdist`` (which starts a spare engine fork server: its imports are
under way), and run once the spare is ready (a person who loads nbdist a few seconds before
starting a cluster).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from dataclasses import dataclass, replace

from . import Result
from ._kernel import Kernel

WORKERS = 2


@dataclass(frozen=True)
class Sizes:
    repeats: int = 3


FULL = Sizes()
TINY = Sizes(repeats=1)

_NBDIST = f"""
import time
t0 = time.perf_counter()
get_ipython().run_line_magic("nbdist", "start -n {WORKERS}")
time.perf_counter() - t0
"""

#: The hand-made group of the baselines (here and ``bench_cluster``): sent to each engine, it
#: joins a gloo group at rank 0's port and checks it with an all-reduce of ones.
HAND_MADE_GROUP = """
def _form(rank, world, port):
    import os
    import torch
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()
"""

_BASELINE = f"""
import time
t0 = time.perf_counter()
import socket
import ipyparallel as ipp
{HAND_MADE_GROUP}
cluster = ipp.Cluster(n={WORKERS})
rc = cluster.start_and_connect_sync()
rc.wait_for_engines({WORKERS})
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
ars = [rc[e].apply_async(_form, r, {WORKERS}, port) for r, e in enumerate(rc.ids[:{WORKERS}])]
assert [ar.get(120) for ar in ars] == [{WORKERS}.0] * {WORKERS}
time.perf_counter() - t0
"""

_BASELINE_STOP = "rc.close()\ncluster.stop_cluster_sync()"


_SPARE_READY = "from nbdist.notebook.cluster.engines import forks\nassert forks.spare_ready(120)"


def _trial(code: str, stop: str, tmp: str, pause: bool = False) -> float:
    env = {"NBDIST_DATA_DIR": tmp, "IPYTHONDIR": tmp + "/ipython"}
    with Kernel(env) as k:
        k.run("%load_ext nbdist")
        if pause:
            k.run(_SPARE_READY, timeout=150)
        seconds = k.value(code, timeout=300)
        k.run(stop, timeout=120)
    return seconds


def run(tiny: bool = False, **sizes) -> list[Result]:
    """Seconds from the start cell to a ready process group, nbdist and baseline."""
    s = replace(TINY if tiny else FULL, **sizes)
    got: dict[str, list[float]] = {"nbdist": [], "baseline": [], "warm": []}
    with tempfile.TemporaryDirectory(prefix="nbdist-bench-") as tmp:
        for i in range(s.repeats):
            order = ["nbdist", "warm", "baseline"]
            for side in order if i % 2 == 0 else order[::-1]:
                if side == "baseline":
                    got[side].append(_trial(_BASELINE, _BASELINE_STOP, tmp))
                else:
                    got[side].append(_trial(_NBDIST, "%nbdist stop", tmp, side == "warm"))
    base = statistics.median(got["baseline"])
    return [
        Result(
            f"start{label}: %nbdist start -n {WORKERS} / ipyparallel + hand-made group",
            statistics.median(got[side]),
            base,
            "s",
            "< 0.5",
        )
        for side, label in (("nbdist", ""), ("warm", ", %load_ext's spare ready"))
    ]


if __name__ == "__main__":
    from . import table

    print(table(run(tiny="--tiny" in sys.argv)))
