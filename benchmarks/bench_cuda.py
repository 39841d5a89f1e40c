"""Figures for nbdist on one CUDA GPU (not a test: run it by hand on a GPU machine).

    python benchmarks/bench_cuda.py [--json FILE]

1. Start time: ``nbdist.start(n=1)`` with the GPU (NCCL on cuda:0), and with the GPU hidden
   (``CUDA_VISIBLE_DEVICES=""``: gloo on CPU) for comparison; and the round trip of an empty cell.
2. Training speed: steps/s of a DDP MLP on cuda:0 through ``nbdist.train_step``, fp32 vs
   ``precision="bf16"`` vs ``precision="fp16"``, at two sizes.
3. Whether NCCL lets two processes share one GPU (plain torch, no nbdist): the reason a second
   engine on a one-GPU machine gets no GPU.
4. ``%%distributed`` against ``torchrun`` (``benchmarks/bench_train.py``, same loop, sides
   alternated): one rank per GPU with NCCL, at the benchmark's sizes and at sizes that keep the
   GPU busy; and two ranks on this machine's CPUs with gloo (the GPU hidden from both sides).

``--only start,train,share,torchrun`` runs some of them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import nbdist  # noqa: E402
from benchmarks import environ  # noqa: E402

_TRAIN = """
import time, torch, torch.nn as nn, torch.nn.functional as F

def bench(width, depth, batch, steps, precision):
    torch.manual_seed(0)
    torch.cuda.reset_peak_memory_stats()
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    net = nn.Sequential(*layers, nn.Linear(width, 10))
    model, opt = nbdist.prepare(net, torch.optim.SGD(net.parameters(), lr=1e-3),
                                precision=precision)
    x = torch.randn(batch, width, device=nbdist.device())
    y = torch.randint(0, 10, (batch,), device=nbdist.device())
    def run(n):
        for _ in range(n):
            with nbdist.train_step(model, opt) as step:
                loss = F.cross_entropy(model(x), y)
                step.backward(loss)
        return loss
    run(20)  # warm-up: cuBLAS heuristics, autocast caches, the scaler's first steps
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    loss = run(steps)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    return {"steps_per_s": steps / dt, "ms_per_step": 1000 * dt / steps,
            "loss": float(loss.detach()), "peak_mem_mb": torch.cuda.max_memory_allocated() / 2**20}
"""

_SHARE_PROBE = r"""
import os, sys, datetime, torch, torch.distributed as dist, torch.multiprocessing as mp

def work(rank, path):
    torch.cuda.set_device(0)
    store = dist.FileStore(path, 2)
    try:
        dist.init_process_group("nccl", store=store, rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=30))
        t = torch.ones(4, device="cuda:0") * (rank + 1)
        dist.all_reduce(t)
        torch.cuda.synchronize()
        print(f"rank {rank}: ok, all_reduce gave {t.tolist()}", flush=True)
        dist.destroy_process_group()
    except Exception as e:
        print(f"rank {rank}: {type(e).__name__}: {str(e).splitlines()[0][:300]}", flush=True)
        os._exit(3)

if __name__ == "__main__":
    mp.spawn(work, args=(sys.argv[1],), nprocs=2)
"""


def _start_times(repeat: int, hide_gpu: bool) -> list[dict]:
    out = []
    with environ("CUDA_VISIBLE_DEVICES", "" if hide_gpu else None):
        for _ in range(repeat):
            t0 = time.perf_counter()
            c = nbdist.start(n=1)
            wall = time.perf_counter() - t0
            try:
                t1 = time.perf_counter()
                c.run("import torch\nx = torch.ones(1, device=nbdist.device())\nx.sum().item()")
                first = time.perf_counter() - t1
                lat = []
                for _ in range(20):
                    t2 = time.perf_counter()
                    c.run("1")
                    lat.append(time.perf_counter() - t2)
                out.append({"backend": c.backend, "device": c.slots[0].device, "start_s": wall,
                            "ready_s": c.ready_seconds, "first_cell_s": first,
                            "empty_cell_ms": 1000 * statistics.median(lat)})  # fmt: skip
            finally:
                c.stop()
    return out


def _train_speed() -> list[dict]:
    sizes = [("small", 1024, 4, 256, 300), ("large", 4096, 4, 2048, 100)]
    rows = []
    with nbdist.start(n=1) as c:
        c.run(_TRAIN)
        for name, width, depth, batch, steps in sizes:
            for precision in ("fp32", "bf16", "fp16"):
                r = c.run(f"bench({width}, {depth}, {batch}, {steps}, {precision!r})")
                rows.append({"size": name, "width": width, "depth": depth, "batch": batch,
                             "precision": precision, **r})  # fmt: skip
    return rows


def _share_probe() -> str:
    with tempfile.TemporaryDirectory() as d:
        script = Path(d) / "probe.py"
        script.write_text(_SHARE_PROBE)
        try:
            p = subprocess.run(
                [sys.executable, str(script), str(Path(d) / "store")],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return "timed out after 120 s (hung)"
        lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.startswith("rank ")]
        return f"exit {p.returncode}: " + " | ".join(lines or (p.stderr.strip().splitlines()[-1:]))


def _vs_torchrun() -> list:
    """bench_train's comparison with one rank on the GPU (NCCL on both sides), at its own sizes
    and at GPU-sized ones, then with two ranks on the CPUs (gloo), the GPU hidden."""
    from benchmarks import bench_train, table

    results = bench_train.run(workers=1, repeats=3)
    big = bench_train.run(workers=1, repeats=2, mlp=(4096, 4096), cnn=(512, 512))
    results += [replace(r, name=r.name + " (large)") for r in big]
    print(table(results), flush=True)
    with environ("CUDA_VISIBLE_DEVICES", ""):
        cpu = [replace(r, name=r.name + " (CPU, 2 ranks)") for r in bench_train.run(repeats=2)]
    print(table(cpu), flush=True)
    return results + cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--only", default="start,train,share,torchrun", help="sections, by name")
    args = ap.parse_args()
    only = set(args.only.split(","))
    os.environ.setdefault("NBDIST_DATA_DIR", tempfile.mkdtemp(prefix="nbdist-bench-"))
    import torch

    res = {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "",
    }
    print(f"# {res['gpu']}, torch {res['torch']}, NCCL {res['nccl']}\n", flush=True)

    if "start" in only:
        _start_section(res)
    if "train" in only:
        _train_section(res)
    if "share" in only:
        res["two_ranks_one_gpu_nccl"] = _share_probe()
        print(f"NCCL, two processes on cuda:0: {res['two_ranks_one_gpu_nccl']}", flush=True)
    if "torchrun" in only:
        res["vs_torchrun"] = [{**asdict(r), "ratio": r.ratio} for r in _vs_torchrun()]
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


def _start_section(res: dict) -> None:
    res["start_gpu"] = _start_times(3, hide_gpu=False)
    res["start_cpu"] = _start_times(2, hide_gpu=True)
    print(
        "| engines | backend | device | start s (wall) | ready s | first cell s | empty cell ms |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, rows in (("1, GPU", res["start_gpu"]), ("1, GPU hidden", res["start_cpu"])):
        for r in rows:
            print(
                f"| {label} | {r['backend']} | {r['device']} | {r['start_s']:.2f} | "
                f"{r['ready_s']:.2f} | {r['first_cell_s']:.3f} | {r['empty_cell_ms']:.1f} |"
            )
    print(flush=True)


def _train_section(res: dict) -> None:
    res["train"] = _train_speed()
    base = {(r["size"]): r["steps_per_s"] for r in res["train"] if r["precision"] == "fp32"}
    print("| MLP | batch | precision | steps/s | ms/step | vs fp32 | peak MiB | last loss |")
    print("|---|---|---|---|---|---|---|---|")
    for r in res["train"]:
        print(f"| {r['size']} ({r['depth']}x{r['width']}) | {r['batch']} | {r['precision']} | "
              f"{r['steps_per_s']:.1f} | {r['ms_per_step']:.2f} | "
              f"{r['steps_per_s'] / base[r['size']]:.2f}x | {r['peak_mem_mb']:.0f} | "
              f"{r['loss']:.3f} |")  # fmt: skip
    print(flush=True)


if __name__ == "__main__":
    main()
