"""A soak, not a timed test: what a long cell's output and reports cost the kernel, minute by
minute. One ``%%distributed`` cell on 2 ranks runs for ``--minutes`` (30 by default): every
step it redraws a tqdm bar and reports its loss (``nbdist.report(loss=...)``), and every
second it writes a log line on the bar's stream (``tqdm.write``, as a logger beside a bar
does). A kernel that kept the ranks' whole output, and went over it at each redraw
(ipyparallel's client alone: issue 46), would spend more each minute than the last.

Printed: the kernel's CPU in each minute; every process's RSS (kernel, controller, fork
server, engines) at the start and the end; the most that the kernel's client held of one
request's streams, sampled in the kernel every few seconds (the end of a stream is kept, up to
``2 * streams.KEEP`` characters: it grows with the log lines until then). In the table: the
last minute against the first (kernel CPU, kernel RSS, held characters).

``python -m benchmarks.bench_output_soak [--minutes 30]`` prints it all; ``python -m
benchmarks --only output_soak`` runs it for 15 minutes (a benchmark there has 20) and
shows the table's rows.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import tempfile
import time
from dataclasses import dataclass, field

import psutil

from nbdist.notebook.cluster.streams import KEEP

from . import Result
from ._kernel import ROOT, Kernel

RANKS = 2
MINUTES = 30.0  # the script's default; the harness's run is HARNESS_MINUTES
HARNESS_MINUTES = 15.0
TINY_MINUTES = 0.25
SAMPLE_S = 5.0  # seconds between the kernel's samples of what its client holds

#: In the kernel: a thread that writes, every ``every`` s, the most its client holds of one
#: request's streams (nbdist's records say ``held()``; ipyparallel's hold the text whole).
_SAMPLER = """
import json, threading, time, nbdist
def _soak_held(path, every):
    client = nbdist.current().client
    with open(path, "a") as f:
        while True:
            most = 0
            for md in list(client.metadata.values()):
                if isinstance(md, dict):
                    held = getattr(md, "held", None)
                    texts = [dict.get(md, n) or "" for n in ("stdout", "stderr")]
                    size = held() if held else sum(map(len, texts))
                    most = max(most, size)
            f.write(json.dumps({{"t": time.time(), "held": most}}) + "\\n")
            f.flush()
            time.sleep(every)
threading.Thread(target=_soak_held, args=({path!r}, {every!r}), daemon=True).start()
[s.pid for s in nbdist.current().slots]
"""

_CELL = """%%distributed
import math, sys, time
from tqdm.auto import tqdm
end, next_log = time.time() + {seconds!r}, time.time() + 1.0
with tqdm(desc=f"rank {{nbdist.rank()}}", unit="step") as bar:
    step = 0
    while time.time() < end:
        time.sleep({step_s!r})
        loss = 1.0 / (1.0 + step / 1000) + 0.01 * math.sin(step)
        nbdist.report(step=step, loss=loss)
        bar.update(1)
        bar.set_postfix(loss=f"{{loss:.4f}}", refresh=False)
        if time.time() >= next_log:
            line = f"step {{step}}: loss {{loss:.4f}}, lr 1e-3, grad norm 0.53"
            tqdm.write(line, file=sys.stderr)
            next_log += 1.0
        step += 1
step
"""


@dataclass
class Soak:
    """What was measured: the kernel's CPU per window, RSS by process, held characters."""

    window_s: float
    cpu: list[float] = field(default_factory=list)  # the kernel's CPU seconds in each window
    rss: list[dict[str, float]] = field(default_factory=list)  # per window: name -> MB
    held: list[tuple[float, int]] = field(default_factory=list)  # (time, characters)
    steps: int = 0


def _names(k: Kernel, engines: list[int]) -> dict[int, str]:
    """Every process of the kernel's, by what it is."""
    names = {k.pid: "kernel"}
    for r, pid in enumerate(engines):
        names[pid] = f"engine rank {r}"
    for p in k.descendants():
        if p.pid in names:
            continue
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        what = next((w for w in ("controller", "forkserver", "lifeline") if w in cmd), "other")
        names[p.pid] = f"{what} {p.pid}"
    return names


def _rss(names: dict[int, str]) -> dict[str, float]:
    out = {}
    for pid, name in names.items():
        try:
            out[name] = psutil.Process(pid).memory_info().rss / 2**20
        except psutil.Error:
            continue
    return out


def soak(minutes: float, step_ms: float = 5.0) -> Soak:
    """Run the cell for ``minutes`` in a fresh kernel; sample as it runs."""
    seconds = minutes * 60
    window = 60.0 if minutes >= 3 else seconds / 3
    held_file = os.path.join(tempfile.mkdtemp(prefix="nbdist-soak-"), "held.jsonl")
    out = Soak(window)
    with Kernel() as k:
        k.run("%load_ext nbdist")
        k.run(f"%nbdist start -n {RANKS}")
        text, _ = k.run(_SAMPLER.format(path=held_file, every=min(SAMPLE_S, window / 4)))
        names = _names(k, json.loads(text))
        kernel = psutil.Process(k.pid)
        msg_id = k.kc.execute(_CELL.format(seconds=seconds, step_s=step_ms / 1000))
        t0 = time.monotonic()
        deadline = t0 + seconds + 600
        cpu0 = sum(kernel.cpu_times()[:2])
        due = t0 + window
        while True:
            try:
                msg = k.kc.get_iopub_msg(timeout=max(0.05, min(1.0, due - time.monotonic())))
            except queue.Empty:
                msg = None
            if time.monotonic() >= due:  # a window's end: the kernel's CPU, everyone's RSS
                cpu = sum(kernel.cpu_times()[:2])
                out.cpu.append(cpu - cpu0)
                out.rss.append(_rss(names))
                cpu0, due = cpu, due + window
                print(f"  {len(out.cpu) * window / 60:5.1f} min: kernel CPU {out.cpu[-1]:.2f} s",
                      file=sys.stderr, flush=True)  # fmt: skip
            if msg is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the soak cell did not end {seconds + 600:.0f} s on")
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "execute_result":
                out.steps = int(content["data"]["text/plain"])
            elif kind == "error":
                raise RuntimeError(f"the soak cell failed: {content['ename']}: {content['evalue']}")
            elif kind == "status" and content["execution_state"] == "idle":
                break
        k.run("%nbdist stop")
    with open(held_file) as f:
        out.held = [(s["t"], s["held"]) for s in map(json.loads, f)]
    return out


def _held_in(s: Soak, first: bool) -> int:
    """The most held in the first (or last) window of the cell's samples."""
    times = [t for t, h in s.held if h]
    if not times:
        return 0
    lo, hi = (times[0], times[0] + s.window_s) if first else (times[-1] - s.window_s, times[-1])
    return max(h for t, h in s.held if lo <= t <= hi)


def results(s: Soak, minutes: float) -> list[Result]:
    """The table's rows: the last window against the first."""
    name = f"soak {minutes:g} min, {RANKS} ranks, tqdm + report every step"
    held = f"{name}: most held of a request's streams (bound {2 * KEEP:,}), end / start"
    return [
        Result(f"{name}: kernel CPU, last window / first", s.cpu[-1], s.cpu[0], "s", "<= 1.5"),
        Result(
            f"{name}: kernel RSS, end / start",
            s.rss[-1]["kernel"],
            s.rss[0]["kernel"],
            "MB",
            "<= 1.2",
        ),  # fmt: skip
        Result(held, _held_in(s, False), max(1, _held_in(s, True)), "chars"),
    ]


def report(s: Soak) -> str:
    """Everything measured, as text."""
    lines = [f"steps on rank 0: {s.steps:,}; window {s.window_s:g} s"]
    lines.append("kernel CPU per window (s): " + " ".join(f"{c:.2f}" for c in s.cpu))
    first, last = s.rss[0], s.rss[-1]
    lines.append("RSS (MB), start -> end:")
    for name in first:
        lines.append(f"  {name:24s} {first[name]:8.1f} -> {last.get(name, float('nan')):8.1f}")
    most = max((h for _, h in s.held), default=0)
    lines.append(
        f"held of a request's streams (chars): first window {_held_in(s, True):,}, last "
        f"{_held_in(s, False):,}, most {most:,} ({len(s.held)} samples)"
    )
    return "\n".join(lines)


def run(tiny: bool = False) -> list[Result]:
    minutes = TINY_MINUTES if tiny else HARNESS_MINUTES
    s = soak(minutes)
    print(report(s), file=sys.stderr)
    return results(s, minutes)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_output_soak")
    p.add_argument("--minutes", type=float, default=MINUTES, help="how long the cell runs")
    p.add_argument("--step-ms", type=float, default=5.0, help="each step's sleep (ms)")
    args = p.parse_args(argv)
    print(f"nbdist {ROOT}: soak of {args.minutes:g} min, {RANKS} ranks", flush=True)
    s = soak(args.minutes, args.step_ms)
    print(report(s))
    for r in results(s, args.minutes):
        print(f"{r.name}: {r.value:,.2f} / {r.baseline:,.2f} {r.unit} = {r.ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
