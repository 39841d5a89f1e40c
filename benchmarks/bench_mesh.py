"""A device mesh on 4 local engines: memory per rank and throughput of dp, tp, dp × tp and
pp × dp against one process, and checkpoints written sharded against gathered.

The model is a small transformer (``blocks`` blocks of causal self-attention and an MLP over
``width``-wide token embeddings, a head over ``vocab`` tokens; about 12.9M parameters at full
size, 52 MB, 206 MB with gradients and Adam's two moments; short sequences and a small batch, so
that the weights, not the activations, fill the memory), built on the meta device and
materialised by ``nbdist.materialize`` (each rank allocates only its part; the same weights in
every layout). Each layout trains it with Adam on the same synthetic global batch of ``batch``
sequences for ``steps`` steps after ``warmup``, every variant on the same 4 engines:

- **one process**: rank 0 alone, with the threads of all 4 ranks (the same cores), the whole
  batch;
- **dp=4**: DDP over ``nbdist.mesh(dp=4)``, a quarter of the batch per rank;
- **tp=4**: Megatron's split over ``nbdist.mesh(tp=4)`` (q, k, v and the MLP's up projection
  column-wise, the attention's output and the MLP's down projection row-wise), the whole batch
  on every rank;
- **dp=2 × tp=2**: both, half the batch per replica;
- **pp=2 × dp=2**: two pipeline stages (``nbdist.pipeline(..., mesh=mesh)``, 1F1B,
  ``microbatches``), two replicas.

Figures, each the worst rank's, with every rank's in the note:

- *memory*: bytes of parameters, gradients and Adam's state this rank holds after the steps
  (local shards of DTensors), and peak RSS growth from before the model is built (the heap
  trimmed and the high-water mark reset, ``/proc/self/clear_refs``) to the highest point while
  training;
- *throughput*: global samples per second over the timed steps (the slowest rank's time
  between barriers), medians over ``repeats`` rounds;
- *checkpoints*: ``nbdist.checkpoint`` then ``nbdist.restore`` of model and optimizer, the
  slowest rank's time between barriers (medians over rounds), and the peak RSS growth of each
  rank while writing: dp=2 × tp=2, whose DTensor weights each rank writes itself with
  ``torch.distributed.checkpoint`` (a ``step-N.dcp`` folder), against dp=4, whose whole model
  rank 0 gathers and writes (one file).

    python -m benchmarks --only mesh      # or: python -m benchmarks.bench_mesh
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from . import Result, private_data_dir, threads_each

ROOT = Path(__file__).resolve().parents[1]
WORKERS = 4
#: Each variant's mesh (None: one process), in the order each round runs them.
MESHES = {
    "single": None,
    "dp": {"dp": 4},
    "tp": {"tp": 4},
    "dp_tp": {"dp": 2, "tp": 2},
    "pp_dp": {"pp": 2, "dp": 2},
}
NAMES = {"single": "one process", "dp": "dp=4", "tp": "tp=4", "dp_tp": "dp=2 × tp=2",
         "pp_dp": "pp=2 × dp=2"}  # fmt: skip
#: Which variants write checkpoints: (sharded, gathered).
CHECKPOINTED = ("dp_tp", "dp")


@dataclass(frozen=True)
class Sizes:
    """The model and the run; ``TINY`` only checks that every path runs."""

    width: int = 512
    heads: int = 8
    blocks: int = 4
    context: int = 16
    vocab: int = 256
    batch: int = 16  # global: each layout's whole step
    microbatches: int = 2
    steps: int = 6
    warmup: int = 2
    repeats: int = 3


FULL = Sizes()
TINY = Sizes(width=16, heads=4, blocks=2, context=4, vocab=16, batch=4, steps=1, warmup=0,
             repeats=1)  # fmt: skip


def _mb(x: float) -> float:
    return x / 2**20


def _spread(xs: list[float]) -> str:
    """(max - min) / median of repeated measurements, as a percentage."""
    return f"{100 * (max(xs) - min(xs)) / statistics.median(xs):.0f}%"


# -- on the engines ------------------------------------------------------------------------------
def _rss() -> tuple[int, int]:
    """This process's resident set and its high-water mark, in bytes (Linux)."""
    with open("/proc/self/status") as f:
        got = {ln[:5]: int(ln.split()[1]) * 1024 for ln in f if ln.startswith(("VmRSS", "VmHWM"))}
    return got["VmRSS"], got["VmHWM"]


def _fresh_heap() -> None:
    """Free memory back to the system, then reset the RSS high-water mark to the RSS, so that
    what follows measures its own peak."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the kernel's way to reset VmHWM
    except OSError:
        pass


def build(s: Sizes):
    """The transformer, as an ``nn.Sequential`` (a pipeline cuts it between blocks)."""
    from collections import OrderedDict

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Embed(nn.Module):
        def __init__(self):
            super().__init__()
            self.token = nn.Embedding(s.vocab, s.width)
            self.position = nn.Embedding(s.context, s.width)

        def forward(self, idx):
            return self.token(idx) + self.position(torch.arange(idx.shape[1], device=idx.device))

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (nn.Linear(s.width, s.width) for _ in range(3))
            self.out = nn.Linear(s.width, s.width)

        def forward(self, x):
            b, t, _ = x.shape
            hd = s.width // s.heads  # -1 heads: this rank's under tensor parallelism
            q, k, v = (f(x).view(b, t, -1, hd).transpose(1, 2) for f in (self.q, self.k, self.v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.out(y.transpose(1, 2).reshape(b, t, -1))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.attn = nn.LayerNorm(s.width), Attention()
            self.norm2, self.up = nn.LayerNorm(s.width), nn.Linear(s.width, 4 * s.width)
            self.down = nn.Linear(4 * s.width, s.width)

        def forward(self, x):
            x = x + self.attn(self.norm1(x))
            return x + self.down(F.gelu(self.up(self.norm2(x))))

    layers = [("embed", Embed())] + [(f"block{i}", Block()) for i in range(s.blocks)]
    layers += [("norm", nn.LayerNorm(s.width)), ("head", nn.Linear(s.width, s.vocab))]
    return nn.Sequential(OrderedDict(layers))


def plan() -> dict:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    col, row = ColwiseParallel, RowwiseParallel
    return {"block*.attn.q": col(), "block*.attn.k": col(), "block*.attn.v": col(),
            "block*.attn.out": row(), "block*.up": col(), "block*.down": row()}  # fmt: skip


def _loss(logits, targets):
    import torch.nn.functional as F

    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _held_bytes(opt) -> int:
    """Bytes of the parameters ``opt`` updates, their gradients and its state: this rank's
    parts (a DTensor's local shard)."""
    import torch

    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    params = [p for group in opt.param_groups for p in group["params"]]
    tensors = params + [p.grad for p in params if p.grad is not None]
    tensors += [v for st in opt.state.values() for v in st.values() if torch.is_tensor(v)]
    return sum(local(t).numel() * local(t).element_size() for t in tensors)


def _timed(together: bool, work) -> float:
    """Seconds ``work()`` took, between barriers when every rank takes part."""
    import time

    import torch.distributed as dist

    if together:
        dist.barrier()
    t0 = time.perf_counter()
    work()
    if together:
        dist.barrier()
    return time.perf_counter() - t0


def _on_disk(folder: Path) -> tuple[int, int]:
    """Bytes under ``folder``, and its largest file's."""
    sizes = [p.stat().st_size for p in folder.rglob("*") if p.is_file()]
    return sum(sizes), max(sizes, default=0)


def measure(kind: str, sizes: dict, threads: int | None = None, ckpt: str | None = None) -> list:
    """Train variant ``kind`` (``MESHES``); every taking rank's figures, by rank. With
    ``ckpt`` (a folder), also write and restore a checkpoint there."""
    import torch
    import torch.distributed as dist

    import nbdist

    s, shape = Sizes(**sizes), MESHES[kind]
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    _fresh_heap()
    base, _ = _rss()
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, s.vocab, (s.batch, s.context + 1), generator=g) for _ in range(2)]
    data = [(d[:, :-1], d[:, 1:]) for d in data]
    pipe, mine = None, {"rank": nbdist.rank()}
    try:
        with torch.device("meta"):
            model = build(s)
        if shape is None:
            module = nbdist.materialize(model)
        elif "pp" in shape:
            mesh = nbdist.mesh(**shape)
            pipe = nbdist.pipeline(model, split=[f"block{s.blocks // 2}"], loss_fn=_loss,
                                   microbatches=s.microbatches, mesh=mesh)  # fmt: skip
            module = nbdist.materialize(pipe).stage
        else:
            mesh = nbdist.mesh(**shape)
            module = nbdist.prepare(model, mesh=mesh, plan=plan() if "tp" in shape else None)
        if shape and "dp" in shape:  # each replica its own rows of the global batch
            me, dp = mesh["dp"].get_local_rank(), shape["dp"]
            data = [(x[me::dp], y[me::dp]) for x, y in data]
        opt = torch.optim.Adam(module.parameters(), lr=1e-4)

        def step(x, y) -> None:
            opt.zero_grad()
            if pipe is not None:
                pipe.step(x, y)
            else:
                _loss(module(x), y).backward()
            opt.step()

        def steps(n: int) -> None:
            for i in range(n):
                step(*data[i % len(data)])

        together = shape is not None
        steps(s.warmup)
        mine["seconds"] = _timed(together, lambda: steps(s.steps))
        mine["samples_per_s"] = s.batch * s.steps / mine["seconds"]
        mine["rss_growth"] = _rss()[1] - base
        mine["state_bytes"] = _held_bytes(opt)
        if ckpt is not None:
            folder = Path(ckpt) / kind
            save = lambda: nbdist.checkpoint(0, dir=ckpt, run=kind, model=module, opt=opt)  # noqa: E731
            load = lambda: nbdist.restore(dir=ckpt, run=kind, model=module, opt=opt)  # noqa: E731
            _fresh_heap()
            before = _rss()[0]
            mine["write_s"] = _timed(True, save)
            mine["write_peak"] = _rss()[1] - before  # what writing it cost this rank's memory
            mine["load_s"] = _timed(True, load)
            if mine["rank"] == 0:
                mine["format"] = "dcp" if any(folder.glob("step-*.dcp")) else "gathered"
                mine["disk"] = _on_disk(folder)
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
def _rounds(s: Sizes, threads: int, ckpt: str) -> dict[str, list[list[dict]]]:
    """Every variant, ``repeats`` times, on one 4-engine cluster; per variant, per round, the
    ranks' figures."""
    import nbdist
    from nbdist.config import CellOptions

    load = (f"import sys\nif {str(ROOT)!r} not in sys.path: sys.path.insert(0, {str(ROOT)!r})\n"
            "from benchmarks.bench_mesh import measure\n")  # fmt: skip
    got: dict[str, list[list[dict]]] = {k: [] for k in MESHES}
    c = nbdist.start(n=WORKERS, threads_per_engine=threads)
    try:
        for i in range(s.repeats + (s.warmup > 0)):  # a first, untimed round loads code
            kinds = list(MESHES) if i % 2 == 0 else list(MESHES)[::-1]  # none always first
            for kind in kinds:
                alone = kind == "single"
                args = asdict(s if i or not s.warmup else replace(TINY, heads=s.heads))
                where = f"{ckpt}/round{i}" if kind in CHECKPOINTED else None
                many = WORKERS * threads if alone else None  # one process: every rank's threads
                src = f"measure({kind!r}, {args!r}, {many}, {where!r})"
                opts = CellOptions(ranks=(0,) if alone else None, timeout=600)
                rows = c.run(load + src, opts)
                if i or not s.warmup:
                    got[kind].append(rows)
    finally:
        c.stop()
    return got


def run(tiny: bool = False, **sizes) -> list[Result]:
    """Memory and throughput of each layout against one process, and checkpoint times."""
    s = replace(TINY if tiny else FULL, **sizes)
    threads = threads_each(WORKERS)
    with private_data_dir("nbdist-bench-mesh-") as tmp:
        got = _rounds(s, threads, tempfile.mkdtemp(dir=tmp, prefix="ckpt-"))
    last = {k: v[-1] for k, v in got.items()}  # memory: the last round's (bytes held are exact)
    whole = last["single"][0]
    speed = {k: statistics.median(r[0]["samples_per_s"] for r in v) for k, v in got.items()}
    label = f"transformer {s.blocks}x{s.width}, 4 engines"

    def per_rank(rows: list[dict], key: str) -> str:
        return ", ".join(f"{_mb(m[key]):.3g}" for m in rows)

    results = []
    memory = (
        ("state_bytes", f"mesh {label}: params+grads+Adam"),
        ("rss_growth", "mesh: peak RSS growth"),
    )
    for key, title in memory:
        for kind in ("dp", "tp", "dp_tp", "pp_dp"):
            results.append(Result(
                f"{title} per rank, {NAMES[kind]} / one process",
                _mb(max(m[key] for m in last[kind])), _mb(whole[key]), "MB",
                note=f"(ranks 0-3: {per_rank(last[kind], key)})",
            ))  # fmt: skip
    spread = {k: _spread([r[0]["samples_per_s"] for r in v]) for k, v in got.items()}
    for kind in ("dp", "tp", "dp_tp", "pp_dp"):
        results.append(Result(
            f"mesh throughput, batch {s.batch}: {NAMES[kind]} / one process",
            speed[kind], speed["single"], "samples/s",
            note=f"(spread {spread[kind]} vs {spread['single']})",
        ))  # fmt: skip
    sharded, gathered = CHECKPOINTED
    fmt = last[sharded][0]["format"]
    what = f"{NAMES[sharded]} {'sharded (dcp)' if fmt == 'dcp' else 'gathered'}"
    disk = [_mb(b) for k in CHECKPOINTED for b in last[k][0]["disk"]]
    for key, verb in (("write_s", "write"), ("load_s", "load")):
        times = {k: statistics.median(max(m[key] for m in r) for r in got[k]) for k in CHECKPOINTED}
        results.append(Result(
            f"mesh checkpoint {verb}: {what} / {NAMES[gathered]} gathered",
            times[sharded], times[gathered], "s",
            note="(on disk {:.3g} MB, largest file {:.3g}; gathered {:.3g}, {:.3g})".format(*disk),
        ))  # fmt: skip
    results.append(Result(
        f"mesh checkpoint write: peak RSS growth per rank, {what} / {NAMES[gathered]} gathered",
        _mb(max(m["write_peak"] for m in last[sharded])),
        _mb(max(m["write_peak"] for m in last[gathered])), "MB",
        note=f"(ranks 0-3: {per_rank(last[sharded], 'write_peak')}; gathered "
        f"{per_rank(last[gathered], 'write_peak')})",
    ))  # fmt: skip
    return results


if __name__ == "__main__":
    from . import table

    print(table(run(tiny="--tiny" in sys.argv)))
