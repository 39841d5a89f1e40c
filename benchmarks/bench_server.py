"""The sidebar's server on a long run: what an answer costs for 1,000,000 steps on 2 ranks.

The run's 2,000,000 metric rows (loss and one extra) are written straight into a run store in a
fresh data folder; a real Jupyter server (nbdist's extension loaded, a token and a port of its
own) answers over HTTP. Each figure is against what sending the whole table costs, measured in
the same run: the raw SELECT of every row of the run (time), and every row as the JSON the
metrics endpoint once sent in one answer (size).

- the run view's curves (``points=1000&ranks=1``): the first read, which folds the whole run a
  bounded slice per request (``complete: false`` until it has caught up), and a warm one;
- the sidebar card's curve (``points=200&metrics=loss``), warm;
- one page of raw metric rows (the default 1,000);
- the server's event loop while the first read folds: ``/api/status``'s answer time (the
  median; the 95th percentile and the worst in the note), against its median on the quiet
  server.

``python -m benchmarks --only server``.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass

from . import Result, private_data_dir

RANKS = 2


@dataclass(frozen=True)
class Sizes:
    steps: int = 1_000_000
    repeats: int = 5


FULL = Sizes()
TINY = Sizes(steps=2000, repeats=1)


class _Server:
    """A real ``jupyter server`` with nbdist's extension, on a free loopback port."""

    def __init__(self, root: str):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{port}/"
        env = {**os.environ, "JUPYTER_RUNTIME_DIR": os.path.join(root, "runtime")}
        self.log = open(os.path.join(root, "server.log"), "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root",
             "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
             "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
             f"--ServerApp.root_dir={root}"],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter server exited (see {self.log.name})")
            try:
                self.get("api/status", timeout=2)
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("jupyter server did not answer in 120 s") from None
                time.sleep(0.25)  # polling for the server to listen

    def get(self, path: str, timeout: float = 600) -> tuple[bytes, float]:
        """The body of a GET and its seconds."""
        req = urllib.request.Request(
            self.url + path, headers={"Authorization": f"token {self.token}"}
        )
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = r.read()
        return body, time.perf_counter() - t0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(20)
        self.log.close()


def _fill(store, steps: int) -> int:
    """A finished run of ``steps`` steps on ``RANKS`` ranks, written as the kernel's writer
    does: each rank's records of a stretch of steps in turn, a transaction per 50,000 steps."""
    from nbdist.telemetry.events import MetricRecord

    def records(rank: int, first: int, last: int) -> list:
        loss = 2.3 + rank * 1e-3
        return [
            MetricRecord(1e9 + i, i, loss / (1 + i / 1e3), 64, None, {"lr": 1e-3 * (1 - i / steps)})
            for i in range(first, last)
        ]

    rid = store.start_run(name="long", world_size=RANKS, total=steps)
    stretch, chunk = 250, 50_000  # steps a rank sends in one batch; steps a transaction
    for start in range(0, steps, chunk):
        by_rank = [
            (r, records(r, i, min(i + stretch, steps)))
            for i in range(start, min(start + chunk, steps), stretch)
            for r in range(RANKS)
        ]
        store.add_metric_records(rid, by_rank)
    store.update_run(rid, step=steps, loss=0.01, samples_per_s=1000.0)
    store.end_run(rid, "ok")
    return rid


def _whole_table(store, rid: int) -> tuple[int, float, float]:
    """(rows, seconds of the raw SELECT of every row of the run, MB of every row as JSON)."""
    import sqlite3

    conn = sqlite3.connect(store.path)
    t0 = time.perf_counter()
    n = sum(1 for _ in conn.execute("SELECT * FROM metrics WHERE run_id = ? ORDER BY id", (rid,)))
    select_s = time.perf_counter() - t0
    conn.close()
    size, since = 2, 0  # "[" and "]"; each row's JSON and a ", " between
    while True:
        page = store.metrics(rid, since, 100_000)
        if not page:
            break
        size += sum(len(json.dumps(row, allow_nan=False)) + 2 for row in page)
        since = page[-1]["id"]
    return n, select_s, size / 1e6


def _p95(xs: list[float]) -> float:
    return sorted(xs)[int(0.95 * (len(xs) - 1))] if xs else float("nan")


def _pinger(server: _Server, stop: threading.Event, times: list[float]) -> None:
    while not stop.is_set():
        times.append(server.get("api/status")[1])
        stop.wait(0.02)  # a ping every 20 ms


def run(tiny: bool = False) -> list[Result]:
    s = TINY if tiny else FULL
    from nbdist.telemetry.store import RunStore

    with private_data_dir("nbdist-bench-server-"), tempfile.TemporaryDirectory() as root:
        store = RunStore()
        rid = _fill(store, s.steps)
        rows, select_s, table_mb = _whole_table(store, rid)
        assert rows == s.steps * RANKS, rows
        server = _Server(root)
        try:
            quiet = [server.get("api/status")[1] for _ in range(20)]
            view = f"nbdist/api/runs/{rid}/curves?points=1000&ranks=1"
            stop, during = threading.Event(), []
            pinger = threading.Thread(target=_pinger, args=(server, stop, during), daemon=True)
            pinger.start()
            t0, asks = time.perf_counter(), 0
            while True:
                asks += 1
                body, _ = server.get(view)
                if json.loads(body)["complete"]:
                    break
            cold_s = time.perf_counter() - t0
            stop.set()
            pinger.join(10)
            warm = [server.get(view) for _ in range(s.repeats)]
            card_url = f"nbdist/api/runs/{rid}/curves?points=200&metrics=loss"
            card = [server.get(card_url) for _ in range(s.repeats)]
            page_url = f"nbdist/api/runs/{rid}/metrics?since_id={s.steps}"  # a page mid-run
            page = [server.get(page_url) for _ in range(s.repeats)]
        finally:
            server.stop()
        store.close()

    def mb(got):
        return len(got[0][0]) / 1e6

    def sec(got):
        return statistics.median(t for _, t in got)

    head = f"server {s.steps:,} steps x {RANKS} ranks"

    def size(what: str, got: list, target: str) -> Result:
        part = f"(1/{table_mb / mb(got):,.0f} of it)"
        return Result(
            f"{head}: {what} / whole table as JSON", mb(got), table_mb, "MB", target, part
        )

    def time_(what: str, seconds: float, target: str = "", note: str = "") -> Result:
        return Result(f"{head}: {what} / SELECT every row", seconds, select_s, "s", target, note)

    return [
        size("run view curves", warm, "< 0.01"),
        time_("run view curves, warm", sec(warm), "< 0.1"),
        time_("run view curves, first read", cold_s, note=f"({asks} asks)"),
        size("card curve", card, "< 0.001"),
        time_("card curve, warm", sec(card), "< 0.1"),
        size("metrics page", page, "< 0.001"),
        time_("metrics page", sec(page), "< 0.1"),
        Result(
            "server event loop while a run is folded: /api/status / quiet, medians",
            statistics.median(during) if during else float("nan"),
            statistics.median(quiet),
            "s",
            note=f"(95th percentile {_p95(during):.3f} s, worst {max(during, default=0):.3f} s"
            f" of {len(during)})",
        ),
    ]


if __name__ == "__main__":
    from . import table

    print(table(run(tiny="--tiny" in sys.argv)))
