"""Pipeline parallelism: memory per rank, throughput, and the pipeline bubble, on 2 local engines.

The model is an MLP written as an ``nn.Sequential`` of ``blocks`` blocks (``Linear(w, w)`` and a
ReLU) and a 10-class head, about 25M parameters at full size (100 MB; with gradients and Adam's
two moments 400 MB). It is cut in the middle into 2 stages (``nbdist.pipeline``, ``microbatches``
microbatches), one per engine, and trained with Adam on synthetic data for ``steps`` steps after
``warmup``, against two baselines on the same engines:

- **one process** training the whole model on rank 0 alone, with as many threads as the two
  ranks have together (the same cores), on the same global batch;
- **DDP** on the same 2 ranks (``nbdist.prepare``), each rank taking half the global batch.

Figures, each rank's and then the worst or the mean over ranks:

- *memory* (the last round's): bytes of parameters, gradients and optimizer state each rank
  holds after a step (every parameter alive in the rank's process counts, whoever keeps it: the
  pipeline should hold about 1/stages of the whole model's; the note gives its stage's own), and
  peak RSS growth while training, from before the model is built to the highest point during
  the steps (every rank builds the whole model before ``nbdist.pipeline`` cuts it: that
  transient is left out, the heap trimmed and the high-water mark reset once the model is cut);
- *throughput*: global samples per second over the timed steps (the slowest rank's time, between
  barriers; optimizer step included), medians over ``repeats`` rounds;
- *idle share*: ``pipe.idle_share`` after every timed step (the share of ``pipe.step`` a stage
  spent not computing: the bubble plus communication), averaged over steps and ranks, for
  ``gpipe`` and ``1f1b``, beside the bubble of the schedule in theory, (S-1)/(M+S-1).

    python -m benchmarks --only pipeline      # or: python -m benchmarks.bench_pipeline
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from . import Result, private_data_dir, threads_each

ROOT = Path(__file__).resolve().parents[1]
WORKERS = STAGES = 2
CLASSES = 10
#: The variants, in the order each round runs them.
KINDS = ("single", "ddp", "gpipe", "1f1b")


@dataclass(frozen=True)
class Sizes:
    """The model and the run; ``TINY`` only checks that every path runs."""

    width: int = 2048
    blocks: int = 6
    batch: int = 64  # global: the pipeline's whole batch, DDP's two halves, one process's batch
    microbatches: int = 4
    steps: int = 8
    warmup: int = 2
    repeats: int = 3


FULL = Sizes()
TINY = Sizes(width=32, blocks=4, batch=8, steps=2, warmup=1, repeats=1)


def bubble(stages: int, microbatches: int) -> float:
    """The share of a step each stage waits in a GPipe or 1F1B schedule, in theory."""
    return (stages - 1) / (microbatches + stages - 1)


# -- on the engines ------------------------------------------------------------------------------
def _model(s: Sizes):
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(s.width, s.width), nn.ReLU()) for _ in range(s.blocks)]
    return nn.Sequential(*blocks, nn.Linear(s.width, CLASSES))


def _rss() -> tuple[int, int]:
    """This process's resident set and its high-water mark, in bytes (Linux)."""
    got = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                got[line[:5]] = int(line.split()[1]) * 1024
    return got["VmRSS"], got["VmHWM"]


def _fresh_heap() -> None:
    """Free memory back to the system and reset the RSS high-water mark, so that what a run
    measures is its own (what an earlier run freed may otherwise stay in the heap)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
    _reset_peak()


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the kernel's way to reset VmHWM to VmRSS
    except OSError:
        pass


def _held_bytes(opt) -> tuple[int, int]:
    """Bytes of parameters, their gradients and ``opt``'s state: counting every parameter alive
    in this process (whoever keeps it), and counting only those ``opt`` updates."""
    import gc
    import warnings

    import torch

    with warnings.catch_warnings():  # isinstance on some of torch's deprecated objects warns
        warnings.simplefilter("ignore")
        alive = [o for o in gc.get_objects() if isinstance(o, torch.nn.Parameter)]
    own = [p for group in opt.param_groups for p in group["params"]]
    state = [v for st in opt.state.values() for v in st.values() if torch.is_tensor(v)]

    def nbytes(params: list) -> int:
        tensors = params + [p.grad for p in params if p.grad is not None] + state
        return sum(t.numel() * t.element_size() for t in tensors)

    return nbytes(alive), nbytes(own)


def measure(kind: str, sizes: dict, threads: int | None = None) -> list[dict]:
    """Train ``kind`` (``single`` on one rank; ``ddp``, ``gpipe`` or ``1f1b`` on every rank);
    every taking rank's figures, by rank."""
    import time

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import nbdist

    s = Sizes(**sizes)
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    _fresh_heap()
    base, _ = _rss()
    g = torch.Generator().manual_seed(1)
    data = [
        (torch.randn(s.batch, s.width, generator=g),
         torch.randint(0, CLASSES, (s.batch,), generator=g))
        for _ in range(2)
    ]  # fmt: skip
    pipe = None
    try:
        model = _model(s)
        if kind == "single":
            module = model
        elif kind == "ddp":
            half = s.batch // WORKERS
            r = nbdist.rank()
            data = [(x[r * half : (r + 1) * half], y[r * half : (r + 1) * half]) for x, y in data]
            module = nbdist.prepare(model)
        else:
            split = [str(s.blocks // STAGES)]
            pipe = nbdist.pipeline(model, split=split, microbatches=s.microbatches,
                                   loss_fn=F.cross_entropy, schedule=kind)  # fmt: skip
            module = pipe.stage
        del model  # a pipeline stage keeps only its own layers: the others' memory is freed
        _fresh_heap()
        opt = torch.optim.Adam(module.parameters(), lr=1e-4)

        def step(x, y) -> float:
            opt.zero_grad()
            if pipe is not None:
                loss = pipe.step(x, y)
            else:
                loss = F.cross_entropy(module(x), y)
                loss.backward()
            opt.step()
            return loss if pipe is not None else loss.item()

        together = kind != "single"
        for i in range(s.warmup):
            step(*data[i % len(data)])
        if together:
            dist.barrier()
        idle, busy = [], []
        t0 = time.perf_counter()
        for i in range(s.steps):
            loss = step(*data[i % len(data)])
            if pipe is not None:
                idle.append(pipe.idle_share)
                busy.append(pipe.last_step_time)
        if together:
            dist.barrier()
        seconds = time.perf_counter() - t0
        _, peak = _rss()
        held, own = _held_bytes(opt)
        mine = {
            "rank": nbdist.rank(),
            "seconds": seconds,
            "samples_per_s": s.batch * s.steps / seconds,
            "state_bytes": held,
            "own_bytes": own,
            "rss_growth": peak - base,
            "idle_share": statistics.fmean(idle) if idle else None,
            "step_time": statistics.fmean(busy) if busy else None,
            "loss": loss,
        }
    finally:
        torch.set_num_threads(old_threads)
    if not together:
        return [mine]
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    slowest = max(m["seconds"] for m in every)  # the global batch is done when the last rank is
    for m in every:
        m["samples_per_s"] = s.batch * s.steps / slowest
    return every


# -- in the benchmark's process ------------------------------------------------------------------
def _rounds(s: Sizes, threads: int) -> dict[str, list[list[dict]]]:
    """Every variant, ``repeats`` times, on one 2-engine cluster; per variant, per round, the
    ranks' figures."""
    import nbdist
    from nbdist.config import CellOptions

    load = (f"import sys\nif {str(ROOT)!r} not in sys.path: sys.path.insert(0, {str(ROOT)!r})\n"
            "from benchmarks.bench_pipeline import measure\n")  # fmt: skip
    got: dict[str, list[list[dict]]] = {k: [] for k in KINDS}
    c = nbdist.start(n=WORKERS, threads_per_engine=threads)
    try:
        for kind in KINDS:  # untimed: each rank's first run loads code and starts threads
            warm = asdict(replace(TINY, microbatches=s.microbatches))
            threads_of = f", threads={WORKERS * threads}" if kind == "single" else ""
            opts = CellOptions(ranks=(0,) if kind == "single" else None, timeout=600)
            c.run(load + f"measure({kind!r}, {warm!r}{threads_of})", opts)
        for i in range(s.repeats):
            kinds = KINDS if i % 2 == 0 else KINDS[::-1]  # neither side always goes first
            for kind in kinds:
                if kind == "single":  # rank 0 alone, with both ranks' threads
                    opts = CellOptions(ranks=(0,), timeout=600)
                    src = f"measure('single', {asdict(s)!r}, threads={WORKERS * threads})"
                else:
                    opts = CellOptions(timeout=600)
                    src = f"measure({kind!r}, {asdict(s)!r})"
                got[kind].append(c.run(load + src, opts))
    finally:
        c.stop()
    return got


def _mb(x: float) -> float:
    return x / 2**20


def run(tiny: bool = False, **sizes) -> list[Result]:
    """Memory, throughput and idle share of the 2-stage pipeline against its baselines."""
    s = replace(TINY if tiny else FULL, **sizes)
    threads = threads_each(WORKERS)
    with private_data_dir("nbdist-bench-pipe-"):
        got = _rounds(s, threads)
    last = {k: v[-1] for k, v in got.items()}  # memory: the last round's (bytes held are exact)
    whole = last["single"][0]
    speed = {k: statistics.median(r[0]["samples_per_s"] for r in v) for k, v in got.items()}
    theory = bubble(STAGES, s.microbatches)
    label = f"{s.blocks}x{s.width} MLP, {STAGES} stages"

    def per_rank(rows: list[dict], key: str) -> str:
        return ", ".join(f"rank {m['rank']} {_mb(m[key]):.3g}" for m in rows)

    pipe = last["1f1b"]
    results = [
        Result(
            f"pipeline {label}: params+grads+Adam held per rank / one process",
            _mb(max(m["state_bytes"] for m in pipe)),
            _mb(whole["state_bytes"]),
            "MB",
            "<= 0.6",
            note=f"({per_rank(pipe, 'state_bytes')}; the stage's own "
            f"{_mb(max(m['own_bytes'] for m in pipe)):.3g}; ddp per rank "
            f"{_mb(max(m['state_bytes'] for m in last['ddp'])):.3g})",
        )
    ]
    for kind in ("1f1b", "gpipe", "ddp"):
        results.append(
            Result(
                f"{kind}: peak RSS growth per rank / one process",
                _mb(max(m["rss_growth"] for m in last[kind])),
                _mb(whole["rss_growth"]),
                "MB",
                note=f"({per_rank(last[kind], 'rss_growth')})",
            )
        )
    spread = {k: _spread([r[0]["samples_per_s"] for r in v]) for k, v in got.items()}
    for kind, base in (("1f1b", "single"), ("gpipe", "single"), ("1f1b", "ddp"),
                       ("ddp", "single")):  # fmt: skip
        results.append(
            Result(
                f"throughput, batch {s.batch}: {_names[kind]} / {_names[base]}",
                speed[kind],
                speed[base],
                "samples/s",
                note=f"(spread {spread[kind]} vs {spread[base]})",
            )
        )
    for kind in ("gpipe", "1f1b"):
        by_rank = [[m["idle_share"] for r in got[kind] for m in r if m["rank"] == k]
                   for k in range(STAGES)]  # fmt: skip
        steps = [m["step_time"] for r in got[kind] for m in r]
        results.append(
            Result(
                f"{kind} M={s.microbatches}: idle share (measured) / bubble (S-1)/(M+S-1)",
                statistics.fmean(x for xs in by_rank for x in xs),
                theory,
                "share",
                note=f"(per rank {', '.join(f'{statistics.fmean(xs):.2f}' for xs in by_rank)}; "
                f"pipe.step {1000 * statistics.fmean(steps):.0f} ms)",
            )
        )
    return results


_names = {
    "single": "one process",
    "ddp": f"DDP {WORKERS} ranks",
    "gpipe": f"pipeline gpipe {STAGES} ranks",
    "1f1b": f"pipeline 1f1b {STAGES} ranks",
}


def _spread(xs: list[float]) -> str:
    """(max - min) / median of repeated measurements, as a percentage."""
    return f"{100 * (max(xs) - min(xs)) / statistics.median(xs):.0f}%"


if __name__ == "__main__":
    from . import table

    print(table(run(tiny="--tiny" in sys.argv)))
