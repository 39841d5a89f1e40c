"""Training from files bigger than memory: ``nbdist.loader`` over Parquet files against torch's
``DataLoader`` + ``DistributedSampler`` over the same files as a map-style dataset.

    python -m benchmarks.bench_streaming [--gb 26] [--dir PATH] [--keep] [--quick]

Writes a Parquet dataset of ``--gb`` GB (ids, a float32 vector of ``dim`` values, a label; row
groups of ``group_rows`` rows, files of about ``file_gb`` GB; snappy, no dictionary) in a temporary
folder under ``--dir`` (default: the system's temporary folder), and trains 2 ranks from it, a
small MLP under ``nbdist.prepare`` (DDP), ``num_workers=2`` loader workers per rank, the same
batch size both ways, for ``steps`` steps after ``warmup`` or ``budget`` seconds, whichever
comes first (the ranks agree on when to stop). Each case runs at two sizes of the data, its
first half of the files (1x) and all of them (2x), with ``shuffle=False`` and ``shuffle=True``:

- nbdist: ``nbdist.loader(files, batch_size, num_workers=2, shuffle=..., seed=0)``: each rank
  reads its contiguous part, each worker its own run of batches, whole row groups at a time;
  ``shuffle=True`` shuffles the row groups' order and the samples within each window of 65,536.
- the baseline: ``DataLoader(ParquetRows(files), batch_size, sampler=DistributedSampler(...),
  num_workers=2)``; ``ParquetRows.__getitem__`` finds a row's row group from the files' footers
  and each worker keeps the last row group it read, decoded to numpy (what a careful user
  writes). ``shuffle=True`` is ``DistributedSampler``'s: one permutation of every index, so
  nearly every sample is in another row group than the last and costs a row group's decoding:
  that case measures the price of random access to Parquet, which the block shuffle avoids.
  ``DistributedSampler`` makes a Python list of every index on each rank, in the engine.

The default size, 26 GB written (1x: 13 GB): more than this 24 GiB, 2-core machine's memory, so
neither the page cache nor the engines' scattered arrays could hold all of it, and the 1x half is
already more than ``nbdist.scatter`` could place (it holds the data in the notebook as well as
in the engines' shards); written in about 2 minutes at this disk's 250-350 MB/s, the whole run
about 10 minutes. On a machine shared with other work, the CPU per sample (engines and workers
together) is steadier than samples/s; ``--repeat`` pairs each case with its baseline.

Before each case the files are dropped from the page cache (``posix_fadvise``), so both sides
read from the disk. Each case runs in freshly started engines (unless a cluster is already
running, as in the smoke test, or ``--reuse``), so each process's peak RSS (``VmHWM``, read
while the workers still run; the engine's peak is reset first) is that case's own. A forked
worker's RSS counts the engine's pages it shares since the fork; USS is what is its own.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, replace

import numpy as np
import psutil

from . import Result, private_data_dir

BASELINE = "DataLoader+DistributedSampler"
_RESULT = "_bench_streaming_result"  # the variable each rank leaves its figures in


@dataclass(frozen=True)
class Sizes:
    """The data and the loop; ``QUICK`` only checks that every path runs."""

    gb: float = 26.0  # written; the 1x case reads the first half of the files
    dim: int = 256  # float32 features per row: ~1 KB rows
    group_rows: int = 8192  # rows per Parquet row group (~8.5 MB)
    file_gb: float = 1.0  # about this much per file
    batch: int = 256
    warmup: int = 10  # steps before the measurement begins...
    warmup_s: float = 10.0  # ...or seconds, whichever comes first
    steps: int = 1500  # measured steps per case (the same at both sizes: RSS compared alike)...
    budget: float = 60.0  # ...unless this many seconds pass first (random access to Parquet)
    workers: int = 2  # loader workers per rank
    ranks: int = 2
    hidden: int = 128
    classes: int = 10
    repeat: int = 1


FULL = Sizes()
QUICK = Sizes(gb=0.02, group_rows=512, file_gb=0.005, batch=64, warmup=2, steps=20, budget=20)


# -- the dataset ----------------------------------------------------------------------------------
def _row_bytes(s: Sizes) -> int:
    return 4 * s.dim + 8 + 8  # features, id, label


def write(folder: str, s: Sizes) -> list[str]:
    """Write ``s.gb`` GB of Parquet files into ``folder``: an even number of files, so that the
    first half is half the data; each file fsynced and dropped from the page cache as it is
    written. Returns their paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = max(int(s.gb * 1e9) // _row_bytes(s), 4 * s.group_rows)
    files = 2 * max(1, math.ceil(s.gb / s.file_gb / 2))
    per_file = math.ceil(rows / files)
    gen = np.random.default_rng(0)
    pool_rows = 8 * s.group_rows  # random rows, reused at shifting offsets: content is not timed
    pool = gen.standard_normal((pool_rows + s.group_rows, s.dim), dtype=np.float32)
    teacher = gen.standard_normal((s.dim, s.classes), dtype=np.float32)
    labels = (pool @ teacher).argmax(1).astype(np.int64)
    paths, at, g = [], 0, 0
    for f in range(files):
        path = os.path.join(folder, f"part-{f:05d}.parquet")
        n_file = min(per_file, rows - at)
        with pq.ParquetWriter(path, _schema(s), compression="snappy", use_dictionary=False) as w:
            for start in range(0, n_file, s.group_rows):
                n = min(s.group_rows, n_file - start)
                off = (g * 7919) % pool_rows
                x = pool[off : off + n]
                w.write_table(
                    pa.table(
                        {
                            "id": pa.array(np.arange(at + start, at + start + n)),
                            "x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), s.dim),
                            "y": pa.array(labels[off : off + n]),
                        }
                    ),
                    row_group_size=s.group_rows,
                )
                g += 1
        at += n_file
        with open(path, "rb") as fh:
            os.fsync(fh.fileno())
        evict([path])
        paths.append(path)
    return paths


def _schema(s: Sizes):
    import pyarrow as pa

    return pa.schema([("id", pa.int64()), ("x", pa.list_(pa.float32(), s.dim)), ("y", pa.int64())])


def evict(paths: list[str]) -> None:
    """Drop ``paths`` from the page cache, so the next reader reads them from the disk."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# -- the baseline: a map-style dataset over the same files ----------------------------------------
class ParquetRows:
    """Rows of Parquet files by index, for ``DataLoader`` + ``DistributedSampler``.

    A row's row group comes from the files' footers (read once, here); each worker process keeps
    the row group it read last, decoded to numpy, so consecutive indices in one row group cost
    one read. A sample is a dict of column to tensor or number, as collate expects.
    """

    def __init__(self, paths: list[str]):
        import pyarrow.parquet as pq

        self.paths = list(paths)
        self.groups: list[tuple[int, int]] = []  # (file, row group) of each block
        self.starts = [0]  # the index of each row group's first row
        for f, p in enumerate(self.paths):
            meta = pq.read_metadata(p)
            for g in range(meta.num_row_groups):
                self.groups.append((f, g))
                self.starts.append(self.starts[-1] + meta.row_group(g).num_rows)
        self._files: dict = {}  # per worker: opened on first use, after the fork
        self._group = -1
        self._cols: dict = {}

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, i: int) -> dict:
        import torch

        k = bisect.bisect_right(self.starts, i) - 1
        if k != self._group:
            self._cols, self._group = self._read(k), k
        r = i - self.starts[k]
        c = self._cols
        return {"id": c["id"][r], "x": torch.from_numpy(c["x"][r]), "y": c["y"][r]}

    def _read(self, k: int) -> dict:
        import pyarrow.parquet as pq

        f, g = self.groups[k]
        if f not in self._files:
            self._files[f] = pq.ParquetFile(self.paths[f])
        table = self._files[f].read_row_group(g).combine_chunks()
        x = table.column("x").chunk(0)
        dim = x.type.list_size
        return {  # numpy copies: writable, so torch takes them without a warning
            "id": table.column("id").to_numpy().copy(),
            "x": x.flatten().to_numpy().reshape(-1, dim).copy(),
            "y": table.column("y").to_numpy().copy(),
        }


# -- on each rank ---------------------------------------------------------------------------------
def _status_kb(pid: int | str, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak() -> None:
    """Make this process's peak RSS (VmHWM) its RSS now (Linux >= 4.0; elsewhere: left)."""
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")


def _cpu(pids: list[int]) -> dict[int, float]:
    out = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            c = psutil.Process(pid).cpu_times()
            out[pid] = c.user + c.system
    return out


def rank_side(side: str, files: list[str], shuffle: bool, sizes: dict) -> dict:
    """One case on this rank (called by the cell on every rank): train from ``files`` through
    ``side``'s loader; the figures for this rank."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn

    import nbdist

    s = Sizes(**sizes)
    # 2 workers a rank on a rank's one core: torch warns; both sides alike
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    _reset_peak()
    me = psutil.Process()
    torch.manual_seed(0)
    model = nbdist.prepare(
        nn.Sequential(nn.Linear(s.dim, s.hidden), nn.ReLU(), nn.Linear(s.hidden, s.classes))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    before = {c.pid for c in me.children()}
    t_made = time.perf_counter()
    if side == "nbdist":
        dl = nbdist.loader(
            files, batch_size=s.batch, num_workers=s.workers, shuffle=shuffle, seed=0
        )
    else:
        import torch.utils.data as tud

        data = ParquetRows(files)
        sampler = tud.DistributedSampler(data, shuffle=shuffle, seed=0)
        dl = tud.DataLoader(data, batch_size=s.batch, sampler=sampler, num_workers=s.workers)
    batches = len(dl)
    it = iter(dl)
    first = t0 = None
    done, samples, flag = 0, 0, torch.zeros(1)
    limit, limit_s = s.warmup, s.warmup_s  # the warm-up's, then the measurement's
    workers: list[int] = []
    cpu0: dict[int, float] = {}
    t = time.perf_counter()
    for _ in range(batches):
        b = next(it)
        if first is None:
            first = time.perf_counter() - t_made
        opt.zero_grad()
        F.cross_entropy(model(b["x"]), b["y"]).backward()
        opt.step()
        done, samples = done + 1, samples + len(b["y"])
        # every rank ends each phase at the same step: a collective a step, on both sides
        flag.fill_(float(done >= limit or time.perf_counter() - t > limit_s))
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            if t0 is not None:
                break
            workers = [c.pid for c in me.children() if c.pid not in before]
            t0 = t = time.perf_counter()
            cpu0 = _cpu([me.pid, *workers])
            done, samples, limit, limit_s = 0, 0, s.steps, s.budget
    if t0 is None or not done:
        raise ValueError(f"{batches} batches per rank leave none to measure after the warm-up")
    seconds = time.perf_counter() - t0
    cpu1 = _cpu([me.pid, *workers])
    procs = []
    for pid in [me.pid, *workers]:  # the workers still run: read their peaks now
        with contextlib.suppress(OSError, psutil.Error):
            procs.append(
                {
                    "pid": pid,
                    "kind": "engine" if pid == me.pid else "worker",
                    "peak_mb": _status_kb(pid, "VmHWM") / 1024,
                    "uss_mb": psutil.Process(pid).memory_full_info().uss / 2**20,
                    "cpu": (cpu1.get(pid, 0.0) - cpu0.get(pid, 0.0)) / seconds,
                }
            )
    del it  # the workers stop
    return {
        "rank": dist.get_rank(),
        "samples": samples,
        "steps": done,
        "seconds": seconds,
        "first_batch_s": first,
        "batches": batches,
        "procs": procs,
    }


def _cell(side: str, files: list[str], shuffle: bool, s: Sizes) -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return (
        f"import sys\nif {root!r} not in sys.path: sys.path.insert(0, {root!r})\n"
        "from benchmarks import bench_streaming as _bs\n"
        f"{_RESULT} = _bs.rank_side({side!r}, {files!r}, {shuffle!r}, {asdict(s)!r})\n"
    )


# -- the notebook's side --------------------------------------------------------------------------
class _Clusters:
    """Where the cases run: the current cluster if there is one; else a fresh cluster per case
    (each process's peak RSS then that case's own), or one for all with ``reuse``."""

    def __init__(self, ranks: int, reuse: bool):
        import nbdist

        self.ranks, self.reuse = ranks, reuse
        self.given = nbdist.current(required=False)
        self.kept = None
        self.stack = contextlib.ExitStack()

    def __enter__(self) -> _Clusters:
        if self.given is None:
            self.stack.enter_context(private_data_dir("nbdist-bench-"))
        return self

    def __exit__(self, *exc) -> None:
        if self.kept is not None:
            self.kept.stop()
        self.stack.close()

    @contextlib.contextmanager
    def case(self):
        import nbdist

        if self.given is not None:
            yield self.given
        elif self.reuse:
            self.kept = self.kept or nbdist.start(n=self.ranks)
            yield self.kept
        else:
            c = nbdist.start(n=self.ranks)
            try:
                yield c
            finally:
                c.stop()


def _case(clusters: _Clusters, side: str, files: list[str], shuffle: bool, s: Sizes) -> dict:
    from nbdist.config import CellOptions

    evict(files)
    with clusters.case() as c:
        t = time.monotonic()
        c.run(_cell(side, files, shuffle, s), CellOptions(timeout=s.budget + 600))
        wall = time.monotonic() - t
        ranks = [c.pull(_RESULT, r) for r in range(len(c.slots))]
        c.run(f"del {_RESULT}")
    seconds = max(r["seconds"] for r in ranks)
    samples = sum(r["samples"] for r in ranks)
    cpu = sum(p["cpu"] * r["seconds"] for r in ranks for p in r["procs"])
    return {
        "cpu_us": 1e6 * cpu / samples,  # CPU of the engines and workers, per sample
        "samples_per_s": samples / seconds,
        "steps": ranks[0]["steps"],
        "seconds": seconds,
        "wall": wall,
        "first_batch_s": max(r["first_batch_s"] for r in ranks),
        "procs": [{"rank": r["rank"], **p} for r in ranks for p in r["procs"]],
    }


def _gb(paths: list[str]) -> float:
    return sum(os.path.getsize(p) for p in paths) / 1e9


def measure(folder: str, s: Sizes, reuse: bool = False, shuffles=(False, True)) -> dict:
    """Write the data into ``folder`` and run every case; everything measured, by case."""
    t = time.monotonic()
    avail = psutil.virtual_memory()
    paths = write(folder, s)
    written = time.monotonic() - t
    rows = sum(_rows(p) for p in paths)
    half = paths[: len(paths) // 2]
    print(
        f"data: {len(paths)} Parquet files, {rows:,} rows of {_row_bytes(s)} B "
        f"({s.dim} float32, id, label), row groups of {s.group_rows:,} rows: "
        f"{_gb(paths):.2f} GB on disk, {rows * _row_bytes(s) / 1e9:.2f} GB as arrays; "
        f"written in {written:.0f} s into {folder}"
    )
    whole = rows * _row_bytes(s)
    print(
        f"memory: {avail.available / 1e9:.1f} GB available of {avail.total / 1e9:.1f} GB before "
        f"writing. As scattered arrays the engines together would hold the whole data: at 2x, "
        f"{whole / 1e9:.1f} GB, {whole / avail.available:.2f}x what is available; at 1x, "
        f"{whole / 2e9:.1f} GB, and nbdist.scatter holds it in the notebook too: "
        f"{whole / avail.available:.2f}x"
    )
    sizes = {"1x": half, "2x": paths}
    cases: dict = {}
    with _Clusters(s.ranks, reuse) as clusters:
        for rep in range(s.repeat):
            for i, (size, files) in enumerate(sizes.items()):
                for j, shuffle in enumerate(shuffles):
                    sides = ["nbdist", BASELINE]
                    if (rep + i + j) % 2:  # alternate which goes first
                        sides.reverse()
                    for side in sides:
                        got = _case(clusters, side, files, shuffle, s)
                        cases.setdefault((size, shuffle, side), []).append(got)
                        print(
                            f"  {size} ({_gb(files):.1f} GB) shuffle={shuffle} {side}: "
                            f"{got['samples_per_s']:,.0f} samples/s over {got['steps']} steps, "
                            f"{got['wall']:.0f} s",
                            flush=True,
                        )
    return {"cases": cases, "sizes": {k: _gb(v) for k, v in sizes.items()}, "write_s": written}


def _rows(path: str) -> int:
    import pyarrow.parquet as pq

    return pq.read_metadata(path).num_rows


def _median(got: list[dict], key: str) -> float:
    return statistics.median(g[key] for g in got)


def _paired(ours: list[dict], theirs: list[dict]) -> str:
    """Each repeat's ratio against the baseline run beside it, seconds apart (on a shared
    machine, steadier than the medians' ratio): their median and range."""
    r = sorted(a["samples_per_s"] / b["samples_per_s"] for a, b in zip(ours, theirs, strict=True))
    return f"{statistics.median(r):.2f} ({r[0]:.2f}-{r[-1]:.2f})" if len(r) > 1 else "-"


def _peaks(got: list[dict], kind: str) -> float:
    """The largest peak RSS (MB) of a process of ``kind`` over a case's repeats."""
    return max(p["peak_mb"] for g in got for p in g["procs"] if p["kind"] == kind)


def _grid(head: list[str], rows: list[list[str]]) -> str:
    """A plain-text table: the first column's cells to the left, the others to the right."""
    widths = [max(len(c) for c in col) for col in zip(head, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < 3 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, rows)])


def report(m: dict, s: Sizes) -> list[Result]:
    """Print the tables; the figures as ``Result``s (nbdist against the baseline)."""
    cases, sizes = m["cases"], m["sizes"]
    results: list[Result] = []
    print(
        f"\n2 ranks x {s.workers} loader workers, batch {s.batch}, MLP {s.dim}-{s.hidden}-"
        f"{s.classes} under DDP; median of {s.repeat} run(s) each; samples/s of both ranks "
        f"together over up to {s.steps} steps or {s.budget:.0f} s after {s.warmup} warm-up steps"
    )
    rows = []
    for (size, shuffle, side), got in cases.items():
        if side != "nbdist":
            continue
        base = cases[(size, shuffle, BASELINE)]
        ours, theirs = _median(got, "samples_per_s"), _median(base, "samples_per_s")
        rows.append(
            [
                f"{size} {sizes[size]:.3g} GB",
                str(shuffle),
                f"{ours:,.0f}",
                f"{theirs:,.0f}",
                f"{ours / theirs:.2f}",
                _paired(got, base),
                f"{_median(got, 'cpu_us'):.0f} / {_median(base, 'cpu_us'):.0f}",
                f"{_median(got, 'steps'):.0f} / {_median(base, 'steps'):.0f}",
                f"{_median(got, 'first_batch_s'):.1f} / {_median(base, 'first_batch_s'):.1f}",
                f"{_median(got, 'wall'):.0f} / {_median(base, 'wall'):.0f}",
            ]
        )
        results.append(
            Result(
                f"streaming {size} ({sizes[size]:.3g} GB) shuffle={shuffle}: nbdist.loader / "
                f"{BASELINE}",
                ours,
                theirs,
                "samples/s",
                ">= 1.00",
            )
        )
    print(
        _grid(
            ["data", "shuffle", "nbdist samples/s", f"{BASELINE} samples/s", "ratio",
             "paired ratios", "CPU µs/sample", "steps timed", "1st batch s", "wall s"],
            rows,
        )
    )  # fmt: skip
    for r, row in zip(results, rows, strict=True):
        print(f"ratio nbdist / {BASELINE} samples/s, {row[0]}, shuffle={row[1]}: {r.ratio:.2f}")

    print("\nevery process (the last run of each case): peak RSS (VmHWM), USS at the end, CPU")
    rows = [
        [size, str(shuffle), side, str(p["rank"]), p["kind"], f"{p['peak_mb']:,.0f}",
         f"{p['uss_mb']:,.0f}", f"{100 * p['cpu']:.0f}"]
        for (size, shuffle, side), got in cases.items()
        for p in got[-1]["procs"]
    ]  # fmt: skip
    head = ["data", "shuffle", "side", "rank", "process", "peak RSS MB", "USS MB", "CPU %"]
    print(_grid(head, rows))

    print("\nthe largest peak RSS of a process, by the size of the data")
    rows = []
    for side in ("nbdist", BASELINE):
        for shuffle in sorted({k[1] for k in cases}):
            for kind in ("engine", "worker"):
                one = _peaks(cases[("1x", shuffle, side)], kind)
                two = _peaks(cases[("2x", shuffle, side)], kind)
                rows.append([side, str(shuffle), kind, f"{one:,.0f}", f"{two:,.0f}",
                             f"{two / one:.2f}"])  # fmt: skip
                if side == "nbdist":
                    results.append(
                        Result(
                            f"streaming peak RSS of an nbdist {kind}, shuffle={shuffle}: "
                            f"{sizes['2x']:.3g} GB / {sizes['1x']:.3g} GB of data",
                            two,
                            one,
                            "MB",
                            "<= 1.05",
                        )
                    )
    head = ["side", "shuffle", "process", f"1x {sizes['1x']:.3g} GB MB",
            f"2x {sizes['2x']:.3g} GB MB", "2x / 1x"]  # fmt: skip
    print(_grid(head, rows))
    return results


def run(tiny: bool = False, **sizes) -> list[Result]:
    """``python -m benchmarks``'s entry point: the data in a temporary folder, removed after."""
    s = replace(QUICK if tiny else FULL, **sizes)
    with tempfile.TemporaryDirectory(prefix="nbdist-bench-streaming-") as folder:
        return report(measure(folder, s, reuse=tiny), s)


def main(argv: list[str] | None = None) -> list[Result]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_streaming",
                                description=__doc__.splitlines()[0])  # fmt: skip
    p.add_argument("--gb", type=float, default=None, help="GB of data to write (default "
                   f"{FULL.gb:g}; the 1x case reads half of it)")  # fmt: skip
    p.add_argument("--dir", default=None, help="where to write it (a temporary folder is made "
                   "there; default: the system's temporary folder)")  # fmt: skip
    p.add_argument("--keep", action="store_true", help="keep the data at the end")
    p.add_argument("--quick", action="store_true", help="a tiny dataset: a smoke test")
    p.add_argument("--reuse", action="store_true", help="one cluster for every case")
    p.add_argument("--steps", type=int, default=None, help="most measured steps per case")
    p.add_argument("--budget", type=float, default=None, help="most measured seconds per case")
    p.add_argument("--repeat", type=int, default=None, help="runs of each case (median counts)")
    p.add_argument("--shuffle", choices=("both", "true", "false"), default="both")
    args = p.parse_args(argv)
    s = QUICK if args.quick else FULL
    given = {"gb": args.gb, "steps": args.steps, "budget": args.budget, "repeat": args.repeat}
    s = replace(s, **{k: v for k, v in given.items() if v is not None})
    shuffles = {"both": (False, True), "true": (True,), "false": (False,)}[args.shuffle]
    base = args.dir or tempfile.gettempdir()
    os.makedirs(base, exist_ok=True)
    folder = tempfile.mkdtemp(prefix="nbdist-bench-streaming-", dir=base)
    t = time.monotonic()
    try:
        m = measure(folder, s, reuse=args.reuse or args.quick, shuffles=shuffles)
        results = report(m, s)
    finally:
        if args.keep:
            print(f"the data is kept in {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    print(f"\nwall time: {time.monotonic() - t:.0f} s in all (writing {m['write_s']:.0f} s)")
    return results


if __name__ == "__main__":
    main()
    sys.exit(0)
