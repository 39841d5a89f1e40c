"""The kernel's collector under load: 64 simulated ranks publishing 20 batches a second each,
through a real run's watch (``run.observers.assembly``: its store, its board with no front
end), polled every 20 ms."""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from unittest import mock

from . import Result


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def _scale(seconds: float, n: int = 64, hz: int = 20) -> tuple[float, float, int, int]:
    """Poll-time p95 and median (s), batches sent and records collected, with n simulated ranks."""
    from types import SimpleNamespace

    from ipyparallel.serialize import deserialize_object, serialize_object

    from nbdist.config import CellOptions
    from nbdist.notebook.run.observers.assembly import assemble
    from nbdist.telemetry import events as ev
    from nbdist.telemetry.store import RunStore

    ranks = {
        r: SimpleNamespace(metadata={"data": {}, "stdout": ""}, outcome=None, pid=r)
        for r in range(n)
    }
    stop, sent = threading.Event(), [0]

    def publish() -> None:
        seq, t_next = 0, time.monotonic()
        while not stop.is_set():
            now = time.time()
            for r in range(n):
                seq += 1
                body = ev.Batch(r, seq, now, [ev.MetricRecord(now, seq, 1.0 / seq, 32, None, None)])
                data, _ = deserialize_object(serialize_object({ev.key(r, seq): body}))
                ranks[r].metadata["data"].update(data)
                sent[0] += 1
            t_next += 1 / hz
            stop.wait(max(0.0, t_next - time.monotonic()))

    class _Handle:  # what display() returns; there is no front end in this process
        def update(self, *args, **kwargs) -> None:
            pass

    with (
        tempfile.TemporaryDirectory() as tmp,
        mock.patch("IPython.display.display", lambda *a, **kw: _Handle()),
    ):
        store = RunStore(f"{tmp}/runs.sqlite")
        mon = assemble("nbdist.report()", CellOptions(), range(n), store_at=store)
        pub = threading.Thread(target=publish)
        pub.start()
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            mon.poll(ranks)
            time.sleep(0.02)
        stop.set()
        pub.join()
        mon.poll(ranks)
        mon.close("ok")
    polls = mon.poll_seconds
    return _quantile(polls, 0.95), statistics.median(polls), sent[0], mon.collector.records


def collector_load(seconds: float) -> Result:
    """The collector's poll time with 64 simulated ranks reporting 20 times a second."""
    name = "collector poll p95, 64 ranks x 20/s / 20 ms poll"
    try:
        p95, p50, sent, got = _scale(seconds)
    except Exception as e:  # in-process use of the monitor's internals: may lag a rewrite
        return Result(name, float("nan"), 20.0, "ms", note=f"n/a: {type(e).__name__}: {e}"[:80])
    note = f"(median {p50 * 1000:.2f} ms; {got}/{sent} records)"
    return Result(name, p95 * 1000, 20.0, "ms", "< 0.5", note=note)
