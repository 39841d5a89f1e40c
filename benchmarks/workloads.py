"""The training loop of the throughput benchmark: one file, run both ways.

``torchrun --nproc-per-node 2 benchmarks/workloads.py --model mlp`` runs it as a script; a
``%%distributed`` cell calls ``train(...)`` from this same module. It is torchrun-style code with
no nbdist in it (except the optional ``report``), so both launchers run exactly the same steps:
``init_process_group`` (a no-op on nbdist engines), plain DDP with nbdist's default settings,
synthetic data made once per rank, and the time of ``steps`` steps after ``warmup``, between two
barriers. Rank 0 returns (and, as a script, prints) the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

#: The fixed synthetic workloads, by name.
MODELS = ("mlp", "cnn")


def build(model: str, hidden: int) -> nn.Module:
    """An MLP on 784 features, or a small CNN on 3x32x32 images; 10 classes; ``hidden`` wide."""
    if model == "mlp":
        return nn.Sequential(
            nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, 10),
        )  # fmt: skip
    if model == "cnn":
        c = max(4, hidden // 32)
        return nn.Sequential(
            nn.Conv2d(3, c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c, 2 * c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(2 * c * 8 * 8, hidden), nn.ReLU(), nn.Linear(hidden, 10),
        )  # fmt: skip
    raise ValueError(f"model must be one of {MODELS}, not {model!r}")


def _data(model: str, batch: int, seed: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = (batch, 784) if model == "mlp" else (batch, 3, 32, 32)
    x = torch.randn(shape, generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    return x.to(device), y.to(device)


def train(
    model: str = "mlp",
    steps: int = 40,
    warmup: int = 5,
    batch: int = 128,
    hidden: int = 1024,
    threads: int | None = None,
    report: bool = False,
    probe: Callable[[], object] | None = None,
    metrics: int = 0,
) -> dict:
    """Train ``model`` for ``warmup + steps`` steps on this rank; return rank 0's figures.

    ``report=True`` calls ``nbdist.report(...)`` every step (nbdist engines only), with
    ``metrics`` more numbers beside the loss (``m0=..., m1=...``: each gets a chart). ``probe`` is
    called on rank 0 just before the timed steps and just after them; its two results are
    returned as ``"probe"`` (the report benchmark reads CPU times with it).
    """
    if threads:
        torch.set_num_threads(threads)
    cuda = torch.cuda.is_available()
    if not dist.is_initialized():  # under torchrun; on nbdist engines the group already stands
        dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if cuda else "cpu")
    torch.manual_seed(0)
    net = nn.parallel.DistributedDataParallel(
        build(model, hidden).to(device),
        device_ids=[device] if cuda else None,
        gradient_as_bucket_view=True,
    )
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x, y = _data(model, batch, seed=1 + rank, device=device)
    if report:
        import nbdist

    def step(i: int) -> float:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        value = loss.item()
        if report:
            extra = {f"m{j}": value * (j + 1) for j in range(metrics)} if metrics else {}
            nbdist.report(step=i, loss=value, samples=batch, **extra)
        return value

    for i in range(warmup):
        step(i)
    dist.barrier()
    marks = [probe()] if probe is not None and rank == 0 else []
    t0 = time.perf_counter()
    for i in range(warmup, warmup + steps):
        loss = step(i)
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    seconds = time.perf_counter() - t0
    if marks:
        marks.append(probe())
    return {
        "model": model,
        "world": world,
        "threads": torch.get_num_threads(),
        "samples_per_s": world * batch * steps / seconds,
        "step_ms": 1000 * seconds / steps,
        "loss": loss,
        **({"probe": marks} if marks else {}),
    }


def _main() -> None:
    p = argparse.ArgumentParser(description="Run the benchmark's training loop (under torchrun).")
    p.add_argument("--model", default="mlp", help=f"one of {MODELS}, or several: mlp,cnn")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--config", default=None, help="JSON {model: {train() arguments}}, instead")
    a = p.parse_args()
    runs = json.loads(a.config) if a.config else {
        m: dict(steps=a.steps, warmup=a.warmup, batch=a.batch, hidden=a.hidden, threads=a.threads)
        for m in a.model.split(",")
    }  # fmt: skip
    for model, kwargs in runs.items():
        out = train(model, **kwargs)
        if dist.get_rank() == 0:
            print("RESULT " + json.dumps(out), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _main()
