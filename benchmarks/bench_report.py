"""What watching a run costs: throughput and CPU with ``report()`` every step, with and without
the live dashboard, against the same loop with no reporting and under torchrun, in one run.

One real kernel; ``rounds`` rounds, each on a fresh 2-rank cluster. In a round, after one
uncounted block that warms the engines up, the four modes below run ``workloads.train`` (a ~3 ms
DDP step) once each, their order rotated from round to round, and torchrun runs the same loop
before or after the cluster's part (alternately; the cluster is stopped meanwhile, as in
``bench_train``, whose launcher this reuses):

- **silent**: ``%%distributed --no-dashboard``, no ``report()``: the baseline;
- **silent (A/A)**: the same again, so its ratio to the first is the noise floor;
- **report()**: ``report()`` every step, ``--no-dashboard``;
- **dashboard**: ``report()`` every step under plain ``%%distributed`` (whatever it shows by
  default: the benchmark reads nothing of the widget but, if it has it, its ``sent_bytes``);
- **dashboard, 10 metrics**: the same with ten more numbers in every ``report()`` (ten more
  charts on the board).

Throughput is steps/s between two barriers (medians over rounds; the note has the median of the
per-round ratios and the spread). On rank 0, at both barriers, ``_kernel.cpu_seconds`` reads the
CPU time of the kernel, the controller (ipyparallel's hub and its scheduler processes), this
driver (the front end that receives the kernel's messages) and every thread of each engine. Each
mode's CPU share is its CPU seconds over its wall seconds, summed over rounds, in % of one core.
Threads are told apart by their ``threading.enumerate()`` names (``native_id``): on the
kernel, noted once a second by a thread of the benchmark's; on an engine, the training thread
(the main one), ``nbdist-reporter`` (sender and health sampler), the engine's own (ipyparallel's
IOPub, control, heartbeat, output capture and zmq threads; nbdist's lifeline), torch's (gloo,
``pt_*``: torchrun has them too) and other.

Then, on the last round's cluster: ``report()`` in a tight loop on an engine (ns/call, with the
sender running; baseline: a no-op function called with the same arguments), the report-to-widget
latency against ipyparallel's bare ``publish_data``, the kernel's CPU over one long cell (60 s)
that reports ten metrics under the dashboard, and the collector fed by 64 simulated ranks.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace

from . import Result
from ._kernel import ROOT, Kernel
from .bench_train import threads_per_worker, torchrun
from .collector_load import collector_load

WORKERS = 2
_TEN = "dashboard, 10 metrics"
MODES = ("silent", "silent (A/A)", "report()", "dashboard", _TEN)
_FLAGS = {"silent": " --no-dashboard", "silent (A/A)": " --no-dashboard",
          "report()": " --no-dashboard", "dashboard": "", _TEN: ""}  # fmt: skip
_KERNEL_BUDGET = 2.0  # % of a core the kernel may take while the dashboard runs (issue 12)
_KINDS = ("training", "reporter", "engine", "torch", "other")  # engine threads, by what they do
_FIRST = "first dashboard"  # the first dashboard cell in the kernel: a warm-up, shown apart
_LONG = "one long cell, 10 metrics"  # after the rounds: the kernel's CPU over a minute
_TRAFFIC = "widget traffic"  # after the rounds: a dashboard block whose bytes are counted


@dataclass(frozen=True)
class Sizes:
    rounds: int = 8  # each mode once per round, order rotated; torchrun once per round
    steps: int = 1000  # timed steps per block (3-5 s)
    warmup: int = 20
    batch: int = 64
    hidden: int = 256
    calls: int = 20_000  # report() calls timed in a tight loop, per chunk
    chunks: int = 5
    latency_s: float = 10.0
    scale_s: float = 5.0
    long_s: float = 60.0  # the long cell with ten metrics


FULL = Sizes()
TINY = Sizes(rounds=1, steps=5, warmup=1, batch=8, hidden=16, calls=200, chunks=2,
             latency_s=1.0, scale_s=0.5, long_s=1.0)  # fmt: skip


@dataclass
class _Cluster:
    """One round's cluster as the probe sees it: the PIDs to read, and the threads' names."""

    engines: list[tuple[int, dict[int, str]]]  # by rank: (pid, {native_id: Python name})
    controller: list[int]


@dataclass
class _Tally:
    """What the blocks of one mode measured, summed (CPU) or listed (throughput)."""

    rate: dict[int, float] = field(default_factory=dict)  # steps/s by round
    wall: float = 0.0
    cpu: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def share(self, key: str) -> float:
        """CPU of ``key`` in % of one core over this mode's blocks."""
        return 100 * self.cpu.get(key, 0.0) / self.wall if self.wall else float("nan")


_SETUP = """%%distributed --no-dashboard
import os, threading
import torch.distributed as dist
_me = (os.getpid(), {t.native_id: t.name for t in threading.enumerate()})
_all = [None] * dist.get_world_size()
dist.all_gather_object(_all, _me)
_all
"""

# In the kernel: a thread that notes, once a second, what each of the kernel's threads is (by
# native id), so that threads started while a cell runs get a name too. "Thread-N" says nothing:
# such threads are named by their class or their target function instead.
_KERNEL_THREADS = """import re, threading, time
_bench_threads = {}
def _bench_label(t):
    if not re.fullmatch(r"Thread-\\d+( \\(.*\\))?", t.name):
        return t.name
    if type(t) is not threading.Thread:
        return type(t).__name__
    return getattr(getattr(t, "_target", None), "__qualname__", "Thread")
def _bench_note_threads():
    while True:
        _bench_threads.update({t.native_id: _bench_label(t) for t in threading.enumerate()})
        time.sleep(1.0)
threading.Thread(target=_bench_note_threads, name="bench: thread names", daemon=True).start()
"""

_CALL_COST = """%%distributed --no-dashboard
import statistics, time
def _noop(step=None, loss=None, samples=None):
    pass
def _timed(f, n):
    t0 = time.perf_counter_ns()
    for i in range(n):
        f(step=i, loss=0.5, samples=8)
    return (time.perf_counter_ns() - t0) / n
_got, _base = [], []
for _ in range({chunks}):
    _got.append(_timed(nbdist.report, {calls}))
    _base.append(_timed(_noop, {calls}))
    time.sleep(0.1)  # the sender drains the queue
(statistics.median(_got), statistics.median(_base))
"""

_LATENCY = """%%distributed --name bench-latency
import time
t_end = time.time() + {seconds}
i = 0
while time.time() < t_end:
    nbdist.report(step=i, loss=1.0 / (i + 1), samples=8)
    i += 1
    time.sleep(0.05)
"""

_LATENCIES = """from nbdist.notebook.run.observers import dashboard as _m
_l = sorted(getattr(getattr(_m, "last", lambda: None)(), "latencies", None) or [])
(_l[len(_l) // 2], _l[int(0.95 * len(_l))], len(_l)) if _l else ()
"""

_SENT = """from nbdist.notebook.run.observers import dashboard as _m
_d = getattr(getattr(_m, "last", lambda: None)(), "dashboard", None)
(getattr(_d, "sent_bytes", getattr(_d, "bytes_sent", None)),)
"""

_RAW = """
import time
from nbdist import current
from nbdist.config import CellOptions
from nbdist.notebook.run.observers.base import RunInfo
from nbdist.notebook.run.observers.watch import Watch
lat = []
class _Raw(Watch):  # reads the ranks' raw publications at every look, as a watch would
    def poll(self, ranks):
        now = time.time()
        for rk in ranks.values():
            d = rk.metadata["data"]
            for k in [k for k in list(d) if k.startswith("raw:")]:
                lat.append(now - d.pop(k))
current().run('''
import time
from ipyparallel.datapub import publish_data
t_end = time.time() + {seconds}
i = 0
while time.time() < t_end:
    publish_data({{f"raw:{{i}}": time.time()}})
    i += 1
    time.sleep(0.05)
''', watch=_Raw(RunInfo(None, '', CellOptions(), (0, 1), time.time()), []))  # its 2 ranks
lat = sorted(lat)
(lat[len(lat) // 2], lat[int(0.95 * len(lat))], len(lat))
"""


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def _engine_thread(tid: int, pid: int, name: str | None, comm: str) -> str:
    """What an engine's thread does: one of ``_KINDS``."""
    if tid == pid:  # threading's MainThread.native_id is the fork server's: it forked the engine
        return "training"
    if name == "nbdist-reporter":
        return "reporter"
    if comm.startswith(("gloo", "pt_")):
        return "torch"
    if name or comm.startswith("ZMQbg"):
        return "engine"
    return "other"


def _block_cpu(
    a: dict, b: dict, c: _Cluster, kernel: tuple[int, dict[int, str]], driver: int
) -> dict[str, float]:
    """CPU seconds between two ``cpu_seconds`` readings, by process group and thread kind."""

    def proc(pid: int) -> float:
        return b["procs"].get(pid, 0.0) - a["procs"].get(pid, b["procs"].get(pid, 0.0))

    def threads(pid: int):
        before = a["threads"].get(pid, {})
        for tid, (comm, s) in b["threads"].get(pid, {}).items():
            yield tid, comm, s - before.get(tid, (comm, 0.0))[1]

    out: dict[str, float] = defaultdict(float)
    kernel, kernel_threads = kernel
    out["kernel"] = proc(kernel)
    out["controller"] = sum(proc(p) for p in c.controller)
    out["hub"] = proc(c.controller[0]) if c.controller else 0.0
    out["front end"] = proc(driver)
    # Threads that started and ended in between leave only this trace: the process's time less
    # its living threads' (the process's is read in 10 ms steps: summed over blocks, unclamped)
    ended = out["kernel"]
    for tid, comm, s in threads(kernel):
        out["kernel: " + ("main" if tid == kernel else kernel_threads.get(tid, comm))] += s
        ended -= s
    out["kernel: threads that ended"] = ended
    for rank, (pid, names) in enumerate(c.engines):
        ended = proc(pid)
        for tid, comm, s in threads(pid):
            out[f"rank {rank} {_engine_thread(tid, pid, names.get(tid), comm)}"] += s
            ended -= s
        out[f"rank {rank} other"] += ended
    return out


class _Bench:
    """The kernel, the current round's cluster, and what each mode measured so far."""

    def __init__(self, k: Kernel, s: Sizes):
        self.k, self.s = k, s
        self.threads = threads_per_worker()
        self.tally = {m: _Tally() for m in (*MODES, "torchrun", _FIRST, _LONG, _TRAFFIC)}
        self.cluster: _Cluster | None = None
        self.sent: list[tuple[int, float]] = []  # dashboard blocks: (bytes sent, cell seconds)
        self.extras: dict = {}

    def _args(self, steps: int | None = None) -> dict:
        s = self.s
        return dict(model="mlp", steps=steps or s.steps, warmup=s.warmup, batch=s.batch,
                    hidden=s.hidden, threads=self.threads)  # fmt: skip

    def start(self, rnd: int) -> None:
        k = self.k
        k.run(f"%nbdist start -n {WORKERS} --threads {self.threads}")
        engines = [(pid, names) for pid, names in k.value(_SETUP)]
        controller = sorted(
            (p for p in k.descendants() if ".controller" in " ".join(p.cmdline())),
            key=lambda p: (p.ppid() != k.pid, p.pid),  # the hub first, then its schedulers
        )
        self.cluster = _Cluster(engines, [p.pid for p in controller])
        # Fresh engines warm up; the kernel's first dashboard imports what it needs, once.
        self.block("dashboard", rnd, into=None if self.tally[_FIRST].rate else _FIRST)

    def block(
        self,
        mode: str,
        rnd: int,
        into: str | None,
        steps: int | None = None,
        count_bytes: bool = False,
    ) -> None:
        """One run of the loop in ``mode``: its steps/s and the CPU of everything meanwhile,
        added to the tally ``into`` (None: not counted)."""
        c, k = self.cluster, self.k
        report = not mode.startswith("silent")
        metrics = 10 if mode == _TEN else 0
        procs = [k.pid, os.getpid(), *c.controller, *(pid for pid, _ in c.engines)]
        threads = [k.pid, *(pid for pid, _ in c.engines)]
        cell = (
            f"%%distributed{_FLAGS[mode]}\n"
            f"import functools, sys\n"
            f"if {str(ROOT)!r} not in sys.path: sys.path.insert(0, {str(ROOT)!r})\n"
            "from benchmarks import _kernel, workloads\n"
            f"_probe = functools.partial(_kernel.cpu_seconds, {procs!r}, {threads!r})\n"
            f"workloads.train(**{self._args(steps)!r}, report={report}, probe=_probe,"
            f" metrics={metrics})\n"
        )
        t0 = time.monotonic()
        got = k.value(cell)
        cell_s = time.monotonic() - t0
        if into is None:
            return
        a, b = got["probe"]
        t = self.tally[into]
        t.rate[rnd] = 1000 / got["step_ms"]
        t.wall += b["t"] - a["t"]
        kernel = (k.pid, k.value("_bench_threads"))
        for key, v in _block_cpu(a, b, c, kernel, os.getpid()).items():
            t.cpu[key] += v
        if count_bytes:
            (sent,) = k.value(_SENT)
            self.sent.append((sent, cell_s))

    def baseline(self, rnd: int) -> None:
        figures = torchrun({"mlp": self._args()}, timeout=600)["mlp"]
        self.tally["torchrun"].rate[rnd] = 1000 / figures["step_ms"]

    def measure_extras(self) -> None:
        """On the running cluster: report()'s cost per call, and report-to-widget latency."""
        k, s = self.k, self.s
        self.extras["call"] = k.value(_CALL_COST.format(calls=s.calls, chunks=s.chunks))
        k.run(_LATENCY.format(seconds=s.latency_s))
        self.extras["latency"] = k.value(_LATENCIES)
        self.extras["raw"] = k.value(_RAW.format(seconds=s.latency_s))
        # one long cell, ten metrics, the dashboard: as long as long_s at the measured pace
        rate = statistics.median(self.tally[_TEN].rate.values())
        self.block(_TEN, -1, into=_LONG, steps=max(10, int(s.long_s * rate)))
        # what the widget sends: counted apart (counting costs a JSON encoding per message)
        k.run("from nbdist.notebook.board import dashboard as _d\n_d.COUNT_BYTES = True")
        self.block("dashboard", -1, into=_TRAFFIC, count_bytes=True)
        k.run("_d.COUNT_BYTES = False")

    def run(self) -> None:
        for rnd in range(self.s.rounds):
            torchrun_first = rnd % 2 == 1
            if torchrun_first:
                self.baseline(rnd)
            self.start(rnd)
            try:
                shift = rnd % len(MODES)
                for mode in MODES[shift:] + MODES[:shift]:
                    self.block(mode, rnd, into=mode)
                if rnd == self.s.rounds - 1:
                    self.measure_extras()
            finally:
                self.k.run("%nbdist stop")
            if not torchrun_first:
                self.baseline(rnd)


def _throughput(b: _Bench) -> list[Result]:
    """Steps/s of each mode against silent, and of silent against torchrun."""
    t = b.tally

    def row(name: str, mode: str, base: str, target: str = "", note: str = "") -> Result:
        got, ref = t[mode].rate, t[base].rate
        paired = statistics.median(got[r] / ref[r] for r in got if r in ref)
        spread = 100 * (max(got.values()) - min(got.values())) / statistics.median(got.values())
        return Result(
            name,
            statistics.median(got.values()),
            statistics.median(ref.values()),
            "steps/s",
            target,
            note=f"(per-round ratio {paired:.3f}; spread {spread:.0f}%{note})",
        )

    sent = [n for n, _ in b.sent if isinstance(n, (int, float))]
    if sent and len(sent) == len(b.sent):
        rate = sum(sent) / sum(s for _, s in b.sent)
        sent = f"; widget sent {sum(sent) / 1e3:.0f} kB, {rate / 1e3:.1f} kB/s"
    else:
        sent = "; widget bytes sent: n/a"
    return [
        row("silent (A/A) / silent: the noise floor", "silent (A/A)", "silent"),
        row("report() every step, --no-dashboard / silent", "report()", "silent", ">= 0.99"),
        row("report() every step + dashboard / silent", "dashboard", "silent", ">= 0.99", sent),
        row("report() with 10 metrics + dashboard / silent", _TEN, "silent", ">= 0.99"),
        row("silent %%distributed / torchrun, same loop", "silent", "torchrun", ">= 1.00"),
    ]


def _cpu(b: _Bench) -> list[Result]:
    """The CPU share of the kernel, the controller and each engine's threads, by mode."""

    def kernel(mode: str, target: str = "") -> Result:  # with its busiest threads in the note
        t = b.tally[mode]
        top = sorted((k for k in t.cpu if k.startswith("kernel: ")), key=t.cpu.get, reverse=True)
        where = ", ".join(f"{k[8:]} {t.share(k):.1f}" for k in top[:3])
        return Result(
            f"CPU {mode}: kernel / {_KERNEL_BUDGET:g} % budget",
            t.share("kernel"),
            _KERNEL_BUDGET,
            "% core",
            target,
            note=f"({where}; front end {t.share('front end'):.1f})",
        )

    out = []
    for mode in ("silent", "report()", "dashboard", _TEN):
        t = b.tally[mode]
        out.append(kernel(mode, "< 1" if mode in ("dashboard", _TEN) else ""))
        hub = t.share("hub")
        out.append(
            Result(
                f"CPU {mode}: controller ({len(b.cluster.controller)} processes)",
                t.share("controller"),
                float("nan"),
                "% core",
                note=f"(hub {hub:.1f}, schedulers {t.share('controller') - hub:.1f})",
            )
        )
        for rank in range(WORKERS):
            share = {kind: max(0.0, t.share(f"rank {rank} {kind}")) for kind in _KINDS}
            out.append(
                Result(
                    f"CPU {mode}: rank {rank} background / training thread",
                    share["reporter"] + share["engine"] + share["other"],
                    share["training"],
                    "% core",
                    note=f"(reporter {share['reporter']:.2f}, engine {share['engine']:.2f}, "
                    f"other {share['other']:.2f}; torch's {share['torch']:.1f})",
                )
            )
    return [*out, kernel(_FIRST), kernel(_LONG, "< 1")]


def _engine(b: _Bench) -> list[Result]:
    """report()'s cost on the training thread, and its thread's CPU per second of training."""
    call_ns, noop_ns = b.extras["call"]
    step_ns = 1e9 / statistics.median(b.tally["silent"].rate.values())

    def reporter_ms(mode: str) -> float:  # ms of CPU per s of training, mean over the ranks
        return statistics.mean(b.tally[mode].share(f"rank {r} reporter") for r in range(WORKERS))

    return [
        Result(
            "report() on the training thread / a no-op call",
            call_ns,
            noop_ns,
            "ns/call",
            note=f"({b.s.chunks} x {b.s.calls} calls, sender running; "
            f"{100 * call_ns / step_ns:.3f}% of a step)",
        ),
        Result(
            "reporter thread, report() every step / silent",
            10 * reporter_ms("report()"),
            10 * reporter_ms("silent"),
            "ms CPU/s",
            note=f"(sender + health sampler; with dashboard {10 * reporter_ms('dashboard'):.2f})",
        ),
    ]


_P50 = "report -> widget p50 / bare publish_data p50"


def _latency(b: _Bench) -> list[Result]:
    lat, raw = b.extras["latency"], b.extras["raw"]
    rows = [Result("bare publish_data p95 (baseline channel)", raw[1] * 1000, 250.0, "ms")]
    if not lat:
        na = "n/a: the monitor keeps no latencies"
        return [Result(_P50, float("nan"), raw[0] * 1000, "ms", note=na), *rows]
    return [
        Result(_P50, lat[0] * 1000, raw[0] * 1000, "ms", note=f"({lat[2]} reports)"),
        Result("report -> widget p95 / 250 ms budget", lat[1] * 1000, 250.0, "ms", "< 1"),
        *rows,
    ]


def run(tiny: bool = False, **sizes) -> list[Result]:
    s = replace(TINY if tiny else FULL, **sizes)
    with (
        tempfile.TemporaryDirectory(prefix="nbdist-bench-") as tmp,
        Kernel({"NBDIST_DATA_DIR": tmp}) as k,
    ):
        k.run("%load_ext nbdist")
        k.run(_KERNEL_THREADS)
        b = _Bench(k, s)
        b.run()
    return [*_throughput(b), *_engine(b), *_cpu(b), *_latency(b), collector_load(s.scale_s)]


if __name__ == "__main__":
    from . import table

    print(table(run(tiny="--tiny" in sys.argv)))
