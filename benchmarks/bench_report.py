"""What watching a run costs: ``nbdist.report()`` every step, and report-to-widget latency.

All in one real kernel and one 2-rank cluster, baselines in the same run:

- **overhead**: ``workloads.train`` with and without ``report()`` every step (blocks alternate,
  medians of step time); and the cost of one ``report()`` call against one training step.
- **latency**: a cell reports every 50 ms under the live dashboard; the time from each
  ``report()`` on an engine to the dashboard's state showing it (p50, p95; same host, so the
  engine's and the kernel's clocks agree). Baseline: ipyparallel's bare ``publish_data`` from the
  engine's main thread to the notebook, same cadence.
- **scale**: the collector (and dashboard, store) fed by 64 simulated ranks reporting 20 times a
  second each, in this process: its poll time against the supervisor's 20 ms poll period.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace

from . import Result
from ._kernel import ROOT, Kernel

WORKERS = 2


@dataclass(frozen=True)
class Sizes:
    repeats: int = 5  # alternating blocks with / without report()
    steps: int = 60
    batch: int = 64
    hidden: int = 256
    calls: int = 20_000  # report() calls timed in a tight loop
    latency_s: float = 10.0
    scale_s: float = 5.0


FULL = Sizes()
TINY = Sizes(repeats=1, steps=3, batch=8, hidden=16, calls=200, latency_s=1.0, scale_s=0.5)


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def _train_cell(s: Sizes, report: bool) -> str:
    args = dict(model="mlp", steps=s.steps, warmup=3, batch=s.batch, hidden=s.hidden)
    return (
        "%%distributed --no-dashboard\n"
        f"import sys\nif {str(ROOT)!r} not in sys.path: sys.path.insert(0, {str(ROOT)!r})\n"
        "from benchmarks import workloads\n"
        f"workloads.train(**{args!r}, report={report})['step_ms']\n"
    )


_CALL_COST = """%%distributed --no-dashboard
import time
n = {calls}
t0 = time.perf_counter()
for i in range(n):
    nbdist.report(step=i, loss=0.5, samples=8)
(time.perf_counter() - t0) / n * 1e6
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

_RAW = """
import time
from nbdist import current
from nbdist.notebook.observers import Observer
lat = []
class _Raw(Observer):
    def on_poll(self, ranks):
        now = time.time()
        for rk in ranks.values():
            d = rk.ar.metadata["data"]
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
''', observers=[_Raw()])
lat = sorted(lat)
(lat[len(lat) // 2], lat[int(0.95 * len(lat))], len(lat))
"""


def _scale(seconds: float, n: int = 64, hz: int = 20) -> tuple[float, float, int, int]:
    """Poll-time p95 and median (s), batches sent and records collected, with n simulated ranks."""
    from types import SimpleNamespace

    from ipyparallel.serialize import deserialize_object, serialize_object

    from nbdist.config import CellOptions
    from nbdist.notebook import dashboard, monitor
    from nbdist.telemetry import events as ev
    from nbdist.telemetry.store import RunStore

    dashboard.Dashboard.show = lambda self: None  # built and updated; no front end here
    ranks = {
        r: SimpleNamespace(ar=SimpleNamespace(metadata={"data": {}, "stdout": ""}), outcome=None)
        for r in range(n)
    }
    cluster = SimpleNamespace(
        slots=[SimpleNamespace(rank=r) for r in range(n)], engines=SimpleNamespace(cluster_id="sim")
    )
    stop, sent = threading.Event(), [0]

    def publish() -> None:
        seq, t_next = 0, time.monotonic()
        while not stop.is_set():
            now = time.time()
            for r in range(n):
                seq += 1
                body = ev.Batch(r, seq, now, [ev.MetricRecord(now, seq, 1.0 / seq, 32, None, None)])
                data, _ = deserialize_object(serialize_object({ev.key(r, seq): body}))
                ranks[r].ar.metadata["data"].update(data)
                sent[0] += 1
            t_next += 1 / hz
            stop.wait(max(0.0, t_next - time.monotonic()))

    with tempfile.TemporaryDirectory() as tmp:
        store = RunStore(f"{tmp}/runs.sqlite")
        with monitor.RunMonitor(cluster, "nbdist.report()", CellOptions(), store=store) as mon:
            pub = threading.Thread(target=publish)
            pub.start()
            t_end = time.monotonic() + seconds
            while time.monotonic() < t_end:
                mon.on_poll(ranks)
                time.sleep(0.02)
            stop.set()
            pub.join()
            mon.on_poll(ranks)
    polls = mon.poll_seconds
    return _quantile(polls, 0.95), statistics.median(polls), sent[0], mon.collector.records


def run(tiny: bool = False, **sizes) -> list[Result]:
    s = replace(TINY if tiny else FULL, **sizes)
    with (
        tempfile.TemporaryDirectory(prefix="nbdist-bench-") as tmp,
        Kernel({"NBDIST_DATA_DIR": tmp}) as k,
    ):
        k.run("%load_ext nbdist")
        k.run(f"%nbdist start -n {WORKERS}")
        try:
            plain, reported = [], []
            for i in range(s.repeats):
                order = (False, True) if i % 2 == 0 else (True, False)
                for report in order:
                    ms = k.value(_train_cell(s, report))
                    (reported if report else plain).append(ms)
            call_us = k.value(_CALL_COST.format(calls=s.calls))
            k.run(_LATENCY.format(seconds=s.latency_s))
            lat = k.value(
                "from nbdist.notebook import monitor as _r\n"
                "_l = sorted(_r.last().latencies)\n"
                "(_l[len(_l) // 2], _l[int(0.95 * len(_l))], len(_l))"
            )
            raw = k.value(_RAW.format(seconds=s.latency_s))
        finally:
            k.run("%nbdist stop")
    step_plain, step_report = statistics.median(plain), statistics.median(reported)
    p95, p50, sent, got = _scale(s.scale_s)
    return [
        Result(
            "report() every step: step time with / without",
            step_report,
            step_plain,
            "ms",
            "<= 1.01",
        ),
        Result("one report() call / one training step", call_us, step_plain * 1000, "us", "< 0.01"),
        Result(
            "report -> widget p50 / bare publish_data p50",
            lat[0] * 1000,
            raw[0] * 1000,
            "ms",
            note=f"({lat[2]} reports)",
        ),
        Result("report -> widget p95 / 250 ms budget", lat[1] * 1000, 250.0, "ms", "< 1"),
        Result("bare publish_data p95 (baseline channel)", raw[1] * 1000, 250.0, "ms"),
        Result(
            "collector poll p95, 64 ranks x 20/s / 20 ms poll",
            p95 * 1000,
            20.0,
            "ms",
            "< 0.5",
            note=f"(median {p50 * 1000:.2f} ms; {got}/{sent} records)",
        ),
    ]


if __name__ == "__main__":
    from . import table

    print(table(run(tiny="--tiny" in sys.argv)))
