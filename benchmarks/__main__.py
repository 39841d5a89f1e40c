"""``python -m benchmarks [--tiny [--jobs N]] [--only NAME,...]``: every benchmark, one table.

Each benchmark measures nbdist against its baseline in the same run; the table shows both and
their ratio. Each runs in a process of its own, with a time limit (``--timeout``), one at a time
(``--jobs`` runs a smoke run's side by side: its figures mean nothing anyway). The exit
status is 1 when a benchmark failed to run (a missed target is not: figures depend on the
machine).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import io
import json
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

from . import Result, cores, table

#: Every benchmark, in the order the table shows them (modules of this package).
BENCHMARKS = (
    "bench_start",
    "bench_cluster",
    "bench_scale",
    "bench_board_frame",
    "bench_cell",
    "bench_train",
    "bench_scatter",
    "bench_report",
    "bench_recovery",
    "bench_loader_resume",
    "bench_streaming",
    "bench_run_again",
    "bench_slow_link",
    "bench_pipeline",
    "bench_mesh",
    "bench_sweep",
    "bench_trackers",
    "bench_debug",
    "bench_server",
    "bench_memory",
    "bench_output_soak",
)

_FIELDS = {f.name for f in dataclasses.fields(Result)}


def _as_result(item, bench: str) -> Result:
    """A ``Result`` from what a benchmark returned (a Result, a dict, or an object alike)."""
    if isinstance(item, Result):
        return item
    data = item if isinstance(item, dict) else getattr(item, "__dict__", {})
    try:
        return Result(**{k: v for k, v in data.items() if k in _FIELDS})
    except TypeError:
        return Result(f"{bench}: {item!r}"[:100], float("nan"), float("nan"), note="(unreadable)")


def _scatter(mod, tiny: bool) -> list[Result]:
    """bench_scatter's own interface: ``main(argv)`` returns the best seconds of each case."""
    size_mb = 8 if tiny else 1024
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its own table
        best = mod.main(["--size-mb", str(size_mb), "--repeat", "1" if tiny else "3"])
    base_name = next(k for k in best if "baseline" in k)
    gbps = {k: size_mb / 1000 / v for k, v in best.items()}
    return [
        Result(f"scatter {size_mb} MB: {k} / ipyparallel", gbps[k], gbps[base_name], "GB/s")
        for k in best
        if k != base_name
    ]


#: Benchmarks with an interface of their own, and how to run them.
_ADAPTERS = {"bench_scatter": _scatter}


def _run_one(name: str, tiny: bool) -> tuple[list[Result], str, bool]:
    """Run benchmark ``name``: its results, any text to show, and whether it ran."""
    if importlib.util.find_spec(f"benchmarks.{name}") is None:
        return [], f"{name}: not present, skipped", True
    mod = importlib.import_module(f"benchmarks.{name}")
    run = getattr(mod, "run", None)
    if run is not None and "tiny" in inspect.signature(run).parameters:
        return [_as_result(r, name) for r in run(tiny=tiny)], "", True
    if name in _ADAPTERS:
        return _ADAPTERS[name](mod, tiny), "", True
    if tiny:
        return [], f"{name}: has no run(tiny=...) entry point, skipped in a tiny run", True
    p = subprocess.run([sys.executable, "-m", f"benchmarks.{name}"], capture_output=True, text=True)
    return [], f"-- {name} (its own output) --\n{p.stdout}{p.stderr[-2000:]}", p.returncode == 0


_MARK = "@@nbdist-bench "


def _child(name: str, tiny: bool) -> int:
    """In the child process: run one benchmark, print its results as marked JSON lines."""
    try:
        got, text, ran = _run_one(name, tiny)
    except Exception:
        got, text, ran = [], f"{name}: FAILED\n{traceback.format_exc(limit=-3)}", False
    for r in got:
        print(_MARK + json.dumps({"result": dataclasses.asdict(r)}), flush=True)
    if text:
        print(_MARK + json.dumps({"note": text.rstrip()}), flush=True)
    return 0 if ran else 1


def _isolated(name: str, tiny: bool, timeout: float) -> tuple[list[Result], list[str], bool]:
    """Run one benchmark in a process of its own (its own session), killed after ``timeout``.

    A benchmark that hangs, patches a module or leaves a cluster running cannot spoil the next.
    """
    cmd = [sys.executable, "-m", "benchmarks", "--child", name] + (["--tiny"] if tiny else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # our child's own process group
        out, _ = proc.communicate()
        return [], [f"{name}: FAILED, still running after {timeout:.0f} s (killed)"], False
    results, notes = [], []
    for line in out.splitlines():
        if line.startswith(_MARK):
            item = json.loads(line[len(_MARK) :])
            if "result" in item:
                results.append(Result(**item["result"]))
            else:
                notes.append(item["note"])
    if proc.returncode != 0 and not notes:
        notes.append(f"{name}: FAILED (exit {proc.returncode})\n{out[-2000:]}")
    return results, notes, proc.returncode == 0


def _load() -> str:
    """The machine's load average (1, 5, 15 min): other work on it skews every figure."""
    try:
        return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except (AttributeError, OSError):
        return "load unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="smallest sizes: a smoke test, not figures")
    p.add_argument("--only", default="", help=f"comma-separated subset of {','.join(BENCHMARKS)}")
    p.add_argument("--timeout", type=float, default=None, help="seconds per benchmark "
                   "(default 1200, or 300 with --tiny)")  # fmt: skip
    p.add_argument("--jobs", type=int, default=1, help="with --tiny: run N benchmarks at once "
                   "(a smoke run's figures mean nothing anyway)")  # fmt: skip
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.jobs != 1 and not args.tiny or args.jobs < 1:
        p.error("--jobs N runs benchmarks side by side: only for a --tiny smoke run")
    if args.child:
        return _child(args.child, args.tiny)
    names = [n.replace("-", "_") for n in args.only.split(",") if n]  # slow-link: bench_slow_link
    names = [n if n.startswith("bench_") else f"bench_{n}" for n in names]
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        p.error(f"unknown benchmark(s) {unknown}; choose from {','.join(BENCHMARKS)}")
    timeout = args.timeout or (300 if args.tiny else 1200)
    import torch

    print(
        f"nbdist benchmarks{' (TINY: smoke run, not figures)' if args.tiny else ''}: "
        f"{platform.node()}, {cores()} cores, Python {platform.python_version()}, "
        f"torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}, {_load()}",
        flush=True,
    )
    results: list[Result] = []
    notes: list[str] = []
    ok = True

    def timed(name: str) -> tuple[list[Result], list[str], bool]:
        t0 = time.monotonic()
        done = _isolated(name, args.tiny, timeout)
        print(f"  {name}: {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
        return done

    with ThreadPoolExecutor(args.jobs) as pool:  # one at a time unless a smoke run asks
        for got, texts, ran in pool.map(timed, names or BENCHMARKS):
            ok &= ran
            results += got
            notes += texts
    print(table(results))
    for text in notes:
        print(text)
    print(f"at the end: {_load()}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
