"""A cluster's own costs at 2, 8 and 16 engines, against plain ipyparallel in the same run.

Four figures per size, each side in a fresh Python process (so each pays its imports):
- **start**: ``nbdist.start(n=N)`` returns with a formed, checked process group (cold: no
  spare fork server; and warm: after ``%load_ext nbdist``'s spare has done its imports, as when
  a person loads nbdist a few seconds before starting, the side ``nbdist-warm``); the baseline
  is ``ipyparallel.Cluster(n=N)`` started and connected, then a gloo group formed on the
  engines by hand and checked with an all-reduce (what a person would write). Each side's
  package is imported before the clock starts; the engines' imports (torch) are timed;
- **round trip**: a trivial cell (``pass``), ``Cluster.run`` against ``DirectView.execute``,
  the median of many;
- **idle CPU**: the CPU of every process the side started (controller, schedulers, fork server,
  engines), over a window with nothing running, as a share of one core;
- **stop**: ``Cluster.stop()`` against ``Client.close()`` + ``Cluster.stop_cluster_sync()``,
  until every process the side started has gone (nbdist's stop reaps; the baseline's is
  waited for here).

Sides alternate between sizes; the figures are medians of the rounds.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import textwrap
from dataclasses import dataclass, replace

from . import Result, private_data_dir
from .bench_start import HAND_MADE_GROUP

_PROBE = HAND_MADE_GROUP + textwrap.dedent(
    """
    import json, os, socket, statistics, sys, time
    import psutil

    side, n, idle_s, trips = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    me = psutil.Process()

    def started():
        return me.children(recursive=True)

    def cpu(procs):
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total

    if side.startswith("nbdist"):  # each side's package imported first: the start is timed
        import nbdist
        from nbdist.notebook.cluster.engines import forks

        if side == "nbdist-warm":  # what %load_ext starts, done before the start (not timed)
            forks.prewarm()
            assert forks.spare_ready(120)
    else:
        import ipyparallel as ipp
    t0 = time.perf_counter()
    if side.startswith("nbdist"):
        cluster = nbdist.start(n=n, oversubscribe=n > 8)
        run = lambda: cluster.run("pass")
    else:
        ipc = ipp.Cluster(n=n, log_level=40)
        rc = ipc.start_and_connect_sync()
        rc.wait_for_engines(n)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ars = [rc[e].apply_async(_form, r, n, port) for r, e in enumerate(rc.ids[:n])]
        assert [ar.get(120) for ar in ars] == [float(n)] * n
        view = rc[:]
        run = lambda: view.execute("pass", block=True)
    start = time.perf_counter() - t0

    run()
    times = []
    if side == "nbdist-warm":  # its start only: the rest is the cold side's
        trips = idle_s = 0
    for _ in range(trips):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)

    procs = started()
    idle = 0.0
    if idle_s:
        time.sleep(1.0)  # let the last cell's replies and any lazy start-up work settle
        c0, w0 = cpu(procs), time.perf_counter()
        time.sleep(idle_s)
        idle = (cpu(procs) - c0) / (time.perf_counter() - w0)

    procs = started()
    t0 = time.perf_counter()
    if side.startswith("nbdist"):
        cluster.stop()
    else:
        rc.close()
        ipc.stop_cluster_sync()
    psutil.wait_procs(procs, timeout=30)
    stop = time.perf_counter() - t0
    left = [p.pid for p in started()]
    print(json.dumps(dict(start=start, trip=statistics.median(times or [0]), idle=idle,
                          stop=stop, left=left)))
    """
)


@dataclass(frozen=True)
class Sizes:
    engines: tuple[int, ...] = (2, 8, 16)
    rounds: int = 2
    idle_s: float = 10.0
    trips: int = 40


FULL = Sizes()
SIDES = ("nbdist", "ipyparallel", "nbdist-warm")
TINY = Sizes(engines=(2,), rounds=1, idle_s=1.0, trips=3)


def _probe(side: str, n: int, s: Sizes) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, side, str(n), str(s.idle_s), str(s.trips)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{side} n={n} failed: {out.stderr.strip().splitlines()[-1:]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if got["left"]:
        raise RuntimeError(f"{side} n={n} left processes running: {got['left']}")
    return got


def _figures(n: int, got: dict[str, list[dict]]) -> list[Result]:
    def figure(
        key: str, what: str, unit: str, target: str, k: float = 1.0, side: str = "nbdist"
    ) -> Result:
        value, base = (statistics.median(g[key] for g in got[s]) * k for s in (side, SIDES[1]))
        return Result(f"{what}, {n} engines: {side} / ipyparallel", value, base, unit, target)

    return [
        figure("start", "start to a checked group", "s", "<= 1.0"),
        figure("start", "start, %load_ext's spare ready", "s", "<= 1.0", side="nbdist-warm"),
        figure("trip", "a trivial cell's round trip", "ms", "<= 1.1", 1000),
        figure("idle", "idle CPU of every process started", "% core", "<= 2.0", 100),
        figure("stop", "stop, every process gone", "s", "<= 1.0"),
    ]


def run(tiny: bool = False, **sizes) -> list[Result]:
    """Start, round trip, idle CPU and stop of nbdist's cluster against plain ipyparallel."""
    s = replace(TINY if tiny else FULL, **sizes)
    results = []
    with private_data_dir("nbdist-bench-cluster-"):
        for n in s.engines:
            got: dict[str, list[dict]] = {side: [] for side in SIDES}
            for i in range(s.rounds):
                for side in SIDES[:: 1 if i % 2 == 0 else -1]:  # the warm side first or last
                    got[side].append(_probe(side, n, s))
            results += _figures(n, got)
    return results


if __name__ == "__main__":
    from . import table

    print(table(run(tiny="--tiny" in sys.argv)))
