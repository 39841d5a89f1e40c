"""A loader's epoch resumed after a SIGKILLed rank: from the kill to the first batch trained
after recovery, with ``nbdist.loader`` over Parquet files continued from the position saved
with ``loader=`` against the usual way in the same run: torch's ``DataLoader`` +
``DistributedSampler`` over the same rows, whose resumed epoch skips the batches already done by
iterating past them (``for i, b in enumerate(dl): if i < done: continue``). Both under
``%%distributed --restarts 1``, 2 ranks, ``num_workers=2``, a checkpoint every K steps; the kill
comes late in a long epoch, where skipping costs the most.

    python -m benchmarks.bench_loader_resume [--rows 400000] [--kill-at 0.8]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
from pathlib import Path

import numpy as np

from benchmarks import Result, table
from benchmarks.bench_recovery import _kill_at, _log

BATCH = 64
EVERY = 20

_SETUP = """
import os, time, itertools, torch
import pyarrow.parquet as pq
torch.manual_seed(0)
model = nbdist.prepare(torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
open(PIDS + str(nbdist.rank()), "w").write(str(os.getpid()))

class Rows(torch.utils.data.Dataset):
    '''The same rows as a map-style Dataset: each worker reads a file's table once.'''
    def __init__(self, files):
        self.files = files
        self.sizes = [pq.ParquetFile(f).metadata.num_rows for f in files]
        self.starts = list(itertools.accumulate([0] + self.sizes))
        self.tables = {}
    def __len__(self):
        return self.starts[-1]
    def __getitem__(self, i):
        f = next(k for k in range(len(self.files)) if i < self.starts[k + 1])
        if f not in self.tables:
            self.tables[f] = pq.read_table(self.files[f]).to_pydict()
        t, j = self.tables[f], i - self.starts[f]
        return {"x": torch.tensor(t["x"][j], dtype=torch.float32), "y": torch.tensor(t["y"][j])}
"""

_NBDIST = """
dl = nbdist.loader(FILES, batch_size=BATCH, num_workers=2, seed=0)
start = nbdist.restore(model=model, opt=opt, loader=dl, run=RUN)
for step, b in zip(range(start, STEPS), dl):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(b["x"]).squeeze(1), b["y"]).backward()
    opt.step()
    nbdist.checkpoint(step, every=EVERY, model=model, opt=opt, loader=dl, run=RUN)
    if nbdist.rank() == 0:
        with open(LOG, "a") as f:
            f.write(f"{step} {time.time()}\\n")
"""

_TORCH = """
import glob
from torch.utils.data import DataLoader, DistributedSampler
data = Rows(sorted(glob.glob(FILES)))
sampler = DistributedSampler(data, seed=0)
dl = DataLoader(data, batch_size=BATCH, sampler=sampler, num_workers=2)
start = nbdist.restore(model=model, opt=opt, run=RUN)
for i, b in enumerate(dl):
    if i < start:
        continue  # the usual resume: past the batches done, each one read
    step = i
    if step >= STEPS:
        break
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(b["x"]).squeeze(1), b["y"]).backward()
    opt.step()
    nbdist.checkpoint(step, every=EVERY, model=model, opt=opt, run=RUN)
    if nbdist.rank() == 0:
        with open(LOG, "a") as f:
            f.write(f"{step} {time.time()}\\n")
"""


def _files(folder: Path, rows: int) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    gen = np.random.default_rng(0)
    per = rows // 8
    for i in range(8):
        x = gen.standard_normal((per, 64)).astype(np.float32)
        table = pa.table({"x": list(x), "y": x.sum(1)})
        pq.write_table(table, folder / f"part-{i}.parquet", row_group_size=10_000)
    return str(folder / "*.parquet")


def _recovery(tmp: Path, files: str, cell: str, steps: int, kill_at: int) -> tuple[float, int]:
    import nbdist
    from nbdist.config import CellOptions

    run = tempfile.mkdtemp(dir=tmp)
    log, pids = Path(run) / "log", Path(run) / "pid"
    with nbdist.start(n=2) as cluster:
        cluster.run(
            f"FILES, LOG, PIDS, RUN = {files!r}, {str(log)!r}, {str(pids)!r}, {Path(run).name!r}\n"
            f"BATCH, EVERY, STEPS = {BATCH}, {EVERY}, {steps}\n" + _SETUP
        )
        out: dict = {}
        t = threading.Thread(target=_kill_at, args=(log, Path(f"{pids}1"), kill_at, out))
        t.start()
        cluster.run(cell, CellOptions(restarts=1, quiet=True, timeout=1800))
        t.join()
    rows = _log(log)
    assert rows[-1][0] == steps - 1, "the run did not finish"
    return _resumed(rows, out["killed_at"])


def _resumed(rows: list[tuple[int, float]], killed_at: float) -> tuple[float, int]:
    """Seconds from the kill to the first step trained after recovery (the first logged step
    that goes back: rank 0 may log a step of its own after the kill, before it notices), and the
    steps redone."""
    steps = [s for s, _ in rows]
    back = next(i for i in range(1, len(rows)) if rows[i][0] <= rows[i - 1][0])
    return rows[back][1] - killed_at, len(steps) - len(set(steps))


def run(tiny: bool = False, rows: int = 400_000, kill_at: float = 0.8) -> list[Result]:
    if tiny:
        rows = 8_000
    steps = rows // 2 // BATCH  # one epoch
    at = int(steps * kill_at) // EVERY * EVERY + EVERY // 2  # between two checkpoints
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        files = _files(tmp, rows)
        ours, redone = _recovery(tmp, files, _NBDIST, steps, at)
        theirs, their_redone = _recovery(tmp, files, _TORCH, steps, at)
    return [
        Result(
            f"kill at step {at} of {steps} -> first batch after (loader= / DataLoader skipping)",
            ours,
            theirs,
            "s",
            target="< 1",
            note=f"steps redone: {redone} and {their_redone} (a checkpoint every {EVERY})",
        )
    ]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=400_000)
    p.add_argument("--kill-at", type=float, default=0.8)
    a = p.parse_args(argv)
    print(table(run(rows=a.rows, kill_at=a.kill_at)))


if __name__ == "__main__":
    main()
