"""Hundreds of ranks: a cluster's start, round trip, stop, idle CPU and memory at 16, 64 and 256
light engines, and the kernel under 64 reporting ranks, each beside plain ipyparallel in the same
run (issue 45). Run as ``python -m benchmarks --only scale``.

Light engines: nbdist's are forked from one fork server (torch imported once, its pages
shared), ``oversubscribe=True`` on however few cores; ipyparallel's are its own ``ipengine``
processes, each started afresh (without its nanny process), with no torch and no process group
(256 with torch would not fit in memory). Each side and size runs in a real IPython kernel of
its own, driven as a front end drives it; timings are taken inside the kernel's cells:

- **start**: ``nbdist.start(n)`` returns with its process group formed and checked (after
  ``%load_ext nbdist``'s spare fork server has done its imports, as after a person's pause);
  ipyparallel's ``Cluster(n).start_cluster_sync()``, ``connect_client_sync()``, then its
  client's ``ids`` polled until all ``n`` are in (its ``wait_for_engines`` missed engines that
  registered between its first look and its callback: at 64 it waited for ever, every engine
  registered; 300 s at most, and a minute with none new ends the wait: at 256, 5 of its engines
  never came), its controller given 900 s to register an engine (its default, 30 s, purged
  engines still starting on two busy cores at 64, and they never came);
- **round trip**: an empty cell on every engine, ``Cluster.run("pass")`` against
  ``DirectView.execute("pass", block=True)``, the median of ``trips``; and the whole
  ``%%distributed`` cell (its live board, its run record) against the same baseline;
- **idle CPU**: every process of the cluster and the kernel, over ``idle_s`` with nothing
  running (once one-off work is done: ``_settle``), as a share of one core;
- **memory**: the proportional set size (PSS: shared pages split among their sharers) of every
  process of the cluster, summed;
- **stop**: ``Cluster.stop()`` against ``Client.close()`` + ``stop_cluster_sync()``, until every
  process of the cluster has gone.

Then, at 64 ranks, the kernel while every rank reports 3 metrics (loss, acc, lr) 20 times a
second for ``report_s`` under the live board: its CPU (every thread of its process) as a share of
a core, its resident memory at the end, and the board's traffic to the front end (bytes of the
widget's comm messages on iopub, per second: what a browser would receive; its code, sent once
when it opens, left out). The baseline is the
same loop without the reports, sent by ``execute`` to 64 ipyparallel engines from a kernel.

The browser's time to draw a frame of the board at 256 ranks is the board's own benchmark
(``bench_board_frame``, in Chromium); ``FRAME_TIME`` takes a callable to show it here too (for
instance ``lambda: bench_board_frame.frame_figures((256,))[256]["frame_ms_median"]``).
"""

from __future__ import annotations

import json
import queue
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from . import Result, private_data_dir
from ._kernel import Kernel, cpu_seconds, cpu_total

#: The browser's ms per frame of a 256-rank board, measured in Chromium by the board's own
#: benchmark (``bench_board_frame``): a callable returning it (None: that benchmark's own row).
FRAME_TIME: Callable[[], float] | None = None


@dataclass(frozen=True)
class Sizes:
    engines: tuple[int, ...] = (16, 64, 256)
    trips: int = 20
    idle_s: float = 10.0
    report_ranks: int = 64
    report_s: float = 10.0


FULL = Sizes()
TINY = Sizes(engines=(2,), trips=2, idle_s=1.0, report_ranks=2, report_s=1.0)

_NBDIST_START = """
from nbdist.notebook.cluster.engines import forks
assert forks.spare_ready(300)
import time, nbdist
_t0 = time.perf_counter()
_c = nbdist.start(n={n}, oversubscribe=True, start_timeout=900)
time.perf_counter() - _t0
"""
_IPP_START = """
import time, ipyparallel as ipp
_t0 = time.perf_counter()
_ipc = ipp.Cluster(n={n}, log_level=40, controller_args=["--IPController.registration_timeout=900"])
_ipc.start_cluster_sync()
_rc = _ipc.connect_client_sync()
_deadline, _last = time.monotonic() + 300, (0, time.monotonic())
while len(_rc.ids) < {n} and time.monotonic() < _deadline:  # not wait_for_engines: see above
    if len(_rc.ids) > _last[0]:
        _last = (len(_rc.ids), time.monotonic())
    elif _last[0] and time.monotonic() - _last[1] > 60:  # none for a minute: it has what it has
        break
    time.sleep(0.02)
_v = _rc[:]
(time.perf_counter() - _t0, len(_rc.ids))
"""
_TRIPS = """
import statistics, time
_ts = []
for _ in range({k}):
    _t = time.perf_counter()
    {call}
    _ts.append(time.perf_counter() - _t)
statistics.median(_ts)
"""
_NBDIST_TRIP = '_c.run("pass")'
_MAGIC_TRIP = 'get_ipython().run_cell_magic("distributed", "", "pass")'
_IPP_TRIP = '_v.execute("pass", block=True)'
_NBDIST_STOP = "_c.stop()"
_IPP_STOP = "_rc.close()\n_ipc.stop_cluster_sync()"

#: A rank's loop: 3 metrics 20 times a second (the baseline's: the same without report()).
_LOOP = """import time
t0 = time.time(); i = 0
while time.time() - t0 < {seconds}:
    {report}i += 1; time.sleep(0.05)
"""
_REPORT = "nbdist.report(step=i, loss=1.0 / (i + 1), acc=i / (i + 1), lr=0.01); "


def _pss(procs: list[psutil.Process]) -> float:
    """Bytes of the processes' proportional set sizes, summed (their shared pages counted once)."""
    total = 0.0
    for p in procs:
        try:
            total += p.memory_full_info().pss
        except (psutil.Error, AttributeError):
            continue
    return total


def _ipython_dir(tmp: Path) -> dict[str, str]:
    """Kernels' environment: an IPython folder of their own, whose ipyparallel engines start
    without their nanny process (nbdist's have none either; 256 engines and their nannies
    beside other work on a 24 GiB machine once met the OOM killer)."""
    profile = tmp / "ipython" / "profile_default"
    profile.mkdir(parents=True)
    (profile / "ipengine_config.py").write_text("c.IPEngine.enable_nanny = False\n")
    return {"IPYTHONDIR": str(tmp / "ipython")}


def _settle(procs: list[psutil.Process], most: float = 0.05, within: float = 60.0) -> None:
    """Wait until ``procs`` together use less than ``most`` of a core over a second (the last
    cell's replies, and one-off work: nbdist's fork server imports what a fresh engine's first
    cell would, once, after the first run), or ``within`` s have passed."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        c0 = cpu_total(procs)
        time.sleep(1.0)
        if cpu_total(procs) - c0 < most:
            return


def _cluster_side(k: Kernel, side: str, n: int, s: Sizes) -> dict:
    """Start, round trips, idle CPU, memory and stop of one side's cluster of ``n`` in ``k``."""
    nbdist = side == "nbdist"
    if nbdist:
        k.run("%load_ext nbdist")
    started = k.value((_NBDIST_START if nbdist else _IPP_START).format(n=n), 1200)
    got = {"start": started} if nbdist else {"start": started[0], "up": started[1]}
    call = _NBDIST_TRIP if nbdist else _IPP_TRIP
    k.run(call, 600)  # the first cell's imports are paid once, not timed
    got["trip"] = k.value(_TRIPS.format(k=s.trips, call=call), 1200)
    if nbdist:
        k.run(_MAGIC_TRIP, 600)
        got["cell"] = k.value(_TRIPS.format(k=s.trips, call=_MAGIC_TRIP), 1200)
    procs = k.descendants()
    everyone = procs + [psutil.Process(k.pid)]
    _settle(everyone)
    c0, w0 = cpu_total(everyone), time.monotonic()
    time.sleep(s.idle_s)
    got["idle"] = (cpu_total(everyone) - c0) / (time.monotonic() - w0)
    got["pss"] = _pss(procs)
    procs = k.descendants()
    t0 = time.monotonic()
    k.run(_NBDIST_STOP if nbdist else _IPP_STOP, 600)
    _, alive = psutil.wait_procs(procs, timeout=120)
    got["stop"] = time.monotonic() - t0
    if alive:
        raise RuntimeError(f"{side} n={n} left {len(alive)} processes running")
    return got


def _counted(k: Kernel, code: str, timeout: float = 600) -> tuple[float, int]:
    """Run a cell; its wall seconds and the bytes of the widget's messages it sent (comm
    messages on iopub: what a front end receives for the board)."""
    msg_id = k.kc.execute(code)
    t0, sent, deadline = time.monotonic(), 0, time.monotonic() + timeout
    while True:
        try:
            msg = k.kc.get_iopub_msg(timeout=0.5)
        except queue.Empty:
            if time.monotonic() > deadline:
                raise TimeoutError(f"cell did not finish in {timeout} s") from None
            continue
        kind = msg["msg_type"]
        if kind == "comm_msg":  # not comm_open: the widget's own code, sent once
            sent += len(json.dumps(msg["content"], default=str))
            sent += sum(len(memoryview(b)) for b in msg.get("buffers") or ())
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if kind == "error":
            raise RuntimeError(f"cell failed: {msg['content']['evalue']}")
        if kind == "status" and msg["content"]["execution_state"] == "idle":
            return time.monotonic() - t0, sent


def _kernel_share(k: Kernel, code: str) -> tuple[float, int, float]:
    """The kernel's CPU over one cell as a share of a core, the widget's bytes, the wall s."""

    def used() -> float:
        return sum(s for _, s in cpu_seconds([], [k.pid])["threads"][k.pid].values())

    before = used()
    wall, sent = _counted(k, code)
    return (used() - before) / wall, sent, wall


def _reporting(s: Sizes, env: dict[str, str]) -> list[Result]:
    """The kernel under ``report_ranks`` ranks reporting 3 metrics at 20/s, and its baseline."""
    n = s.report_ranks
    loop = _LOOP.format(seconds=s.report_s, report=_REPORT)
    bare = _LOOP.format(seconds=s.report_s, report="")
    with Kernel(env) as k:
        _, up = k.value(_IPP_START.format(n=n), 1200)
        k.run(f"_v.execute({bare!r}, block=True)", 600)
        base, _, _ = _kernel_share(k, f"_v.execute({bare!r}, block=True)")
        base_rss = psutil.Process(k.pid).memory_info().rss
        k.run(_IPP_STOP, 600)
    with Kernel(env) as k:
        k.run("%load_ext nbdist")
        k.value(_NBDIST_START.format(n=n), 1200)
        k.run("%%distributed\n" + _LOOP.format(seconds=1, report=_REPORT), 600)  # imports
        share, sent, wall = _kernel_share(k, "%%distributed\n" + loop)
        rss = psutil.Process(k.pid).memory_info().rss
        k.run(_NBDIST_STOP, 600)
    what = f"{n} ranks x 3 metrics x 20/s, live board"
    return [
        Result(f"kernel CPU, {what}: nbdist / ipyparallel execute (no reports, {up} engines)",
               100 * share, 100 * base, "% core",
               note=f"goal <= 10 % of a core: {'met' if share <= 0.10 else 'MISSED'}"),
        Result(f"kernel memory after it, {what}: nbdist / ipyparallel", rss / 2**20,
               base_rss / 2**20, "MiB"),
        Result(f"widget traffic to the front end, {what}", sent / wall / 1024, float("nan"),
               "KiB/s", note="bytes of the board's comm messages on iopub"),
    ]  # fmt: skip


def _figures(n: int, nb: dict, ipp: dict) -> list[Result]:
    short = f" (ipyparallel: {ipp['up']} of {n} came up)" if ipp["up"] < n else ""

    def fig(key: str, what: str, unit: str, target: str = "", k: float = 1.0) -> Result:
        return Result(f"{what}, {n} engines: nbdist / ipyparallel", nb[key] * k, ipp[key] * k,
                      unit, target, short.strip())  # fmt: skip

    cell = Result(f"a %%distributed cell's round trip, {n} engines: nbdist / ipyparallel execute",
                  nb["cell"] * 1000, ipp["trip"] * 1000, "ms")  # fmt: skip
    return [
        fig("start", "start (nbdist: its group formed too)", "s"),
        fig("trip", "an empty cell's round trip (Cluster.run)", "ms", "<= 1.1", 1000),
        cell,
        fig("idle", "idle CPU, every process and the kernel", "% core", "<= 2.0", 100),
        fig("pss", "memory (PSS) of every process", "MiB", "", 2**-20),
        fig("stop", "stop, every process gone", "s"),
    ]


def _said(results: list[Result]) -> list[Result]:
    """``results``, each also written to stderr as it comes (a long run that fails later keeps
    them)."""
    for r in results:
        print(f"{r.name}: {r.value:.4g} / {r.baseline:.4g} {r.unit} {r.note}", file=sys.stderr)
    return results


def run(tiny: bool = False, **sizes) -> list[Result]:
    s = replace(TINY if tiny else FULL, **sizes)
    results: list[Result] = []
    with private_data_dir("nbdist-bench-scale-") as tmp:
        env = _ipython_dir(Path(tmp))
        results += _said(_reporting(s, env))
        for n in s.engines:
            got = {}
            for side in ("nbdist", "ipyparallel"):
                with Kernel(env) as k:
                    got[side] = _cluster_side(k, side, n, s)
            results += _said(_figures(n, got["nbdist"], got["ipyparallel"]))
    if FRAME_TIME is not None:
        results.append(Result("the board's frame in Chromium, 256 ranks", FRAME_TIME(),
                              1000 / 60, "ms", "<= 1.0"))  # fmt: skip
    return results


if __name__ == "__main__":
    from . import table

    print(table(run(tiny="--tiny" in sys.argv)))
