"""``nbdist.loader`` over files on a real 2-rank cluster under DDP: every sample read once per
epoch by one rank and one worker, the same number of steps on both ranks however uneven the
files, and an epoch continued exactly after a SIGKILLed rank (``--restarts``) and after a
failed cell (``--resume``): the sample ids each rank sees, and the final parameters, are those
of an uninterrupted run."""

from __future__ import annotations

import json
import math
import os
import signal
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from processes import wait_until

from nbdist.config import CellOptions
from nbdist.errors import DistributedCellError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

SIZES = [700, 13, 2100, 5, 390]  # rows per file: very uneven
ROWS = sum(SIZES)
STEPS, EVERY = 60, 10


def write_files(folder: Path) -> str:
    """Parquet files of very different sizes (one as JSON lines), ids 0..ROWS-1; their glob."""
    gen = np.random.default_rng(0)
    start = 0
    for i, n in enumerate(SIZES):
        ids = np.arange(start, start + n)
        x = gen.standard_normal((n, 4)).astype(np.float32)
        table = pa.table({"id": ids, "x": list(x), "y": x.sum(1)})
        if i == 3:
            with open(folder / f"part-{i}.jsonl", "w") as f:
                for row in table.to_pylist():
                    f.write(json.dumps({**row, "x": [float(v) for v in row["x"]]}) + "\n")
        else:
            pq.write_table(table, folder / f"part-{i}.parquet", row_group_size=128)
        start += n
    return str(folder / "part-*")


EPOCH = """
dl = nbdist.loader(FILES, batch_size=32, num_workers=2, seed=3, shuffle_window=256)
ids, steps = [], 0
import torch
torch.manual_seed(0)
model = nbdist.prepare(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for b in dl:
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(b["x"]).squeeze(1), b["y"]).backward()  # in step or hang
    opt.step()
    ids += b["id"].tolist()
    steps += 1
result = (steps, len(dl), ids)
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory, cluster):
    pattern = write_files(tmp_path_factory.mktemp("stream"))
    cluster.run(f"FILES = {pattern!r}")
    return pattern


def test_every_sample_once_and_the_same_steps_on_every_rank(cluster, files):
    cluster.run(EPOCH, CellOptions(timeout=120))
    (s0, n0, ids0), (s1, n1, ids1) = (cluster.pull("result", r) for r in (0, 1))
    assert s0 == s1 == n0 == n1 == math.ceil(math.ceil(ROWS / 2) / 32)
    # each rank its own contiguous part; only the padding (the epoch's first samples) repeats
    assert len(set(ids0) & set(ids1)) == len(ids0) + len(ids1) - ROWS
    assert set(ids0) | set(ids1) == set(range(ROWS))
    assert len(ids0) == len(set(ids0)) and len(ids1) == len(set(ids1))


TRAIN = f"""
import json, time, torch
torch.manual_seed(0)
model = nbdist.prepare(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
dl = nbdist.loader(FILES, batch_size=32, num_workers=2, seed=5, shuffle_window=256)

def batches():
    while True:
        yield from dl

it = batches()  # made before the loop restores: its first batch is asked for after
for step in nbdist.steps({STEPS}, every={EVERY}, model=model, opt=opt, loader=dl, run=RUN):
    b = next(it)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(b["x"]).squeeze(1), b["y"]).backward()
    opt.step()
    with open(f"{{LOG}}.{{nbdist.rank()}}", "a") as f:
        f.write(json.dumps([step, b["id"].tolist()]) + "\\n")
    if step == FAIL_AT:
        raise RuntimeError("the cell fails here")
    time.sleep(0.03)
[p.detach().clone() for p in model.parameters()]
"""


def _seen(log: str, rank: int) -> dict[int, list[int]]:
    """Each step's sample ids on ``rank``, as last logged (a step redone after a restart
    overwrites the first try's)."""
    path = Path(f"{log}.{rank}")
    if not path.exists():
        return {}
    return {s: ids for s, ids in (json.loads(line) for line in path.read_text().splitlines())}


def _train(cluster, tmp_path, name: str, fail_at: int = -1, opts=None):
    log = str(tmp_path / name)
    cluster.run(f"LOG, RUN, FAIL_AT = {log!r}, {name!r}, {fail_at}")
    return cluster.run(TRAIN, opts or CellOptions(timeout=180)), log


@pytest.fixture(scope="module")
def reference(cluster, files, tmp_path_factory):
    params, log = _train(cluster, tmp_path_factory.mktemp("ref"), "stream-ref")
    return params, [_seen(log, r) for r in (0, 1)]


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_sigkilled_rank_resumes_the_epoch_with_the_batches_it_would_have_had(
    cluster, files, reference, tmp_path
):
    log = str(tmp_path / "killed")
    victim = cluster.slots[1].pid
    hit = threading.Event()

    def inject():
        try:  # mid-epoch (an epoch is 51 steps), between two checkpoints
            wait_until(lambda: len(_seen(log, 0)) >= 27, 90, what="training to reach step 27")
            os.kill(victim, signal.SIGKILL)
            hit.set()
        except Exception:
            pass

    cluster.run(f"LOG, RUN, FAIL_AT = {log!r}, 'stream-killed', -1")
    t = threading.Thread(target=inject, daemon=True)
    t.start()
    params = cluster.run(TRAIN, CellOptions(restarts=1, timeout=240))
    t.join(5)
    assert hit.is_set(), "the rank was never killed"
    assert [_seen(log, r) for r in (0, 1)] == reference[1]
    assert _same(params, reference[0])


def test_a_failed_cell_resumes_its_epoch_with_resume(cluster, files, reference, tmp_path):
    with pytest.raises(DistributedCellError):
        _train(cluster, tmp_path, "stream-failed", fail_at=33)
    cluster.run("FAIL_AT = -1")
    params = cluster.run(TRAIN, CellOptions(resume=True, timeout=180))
    log = str(tmp_path / "stream-failed")
    assert [_seen(log, r) for r in (0, 1)] == reference[1]
    assert _same(params, reference[0])


PREPARE = """
import torch
torch.manual_seed(0)
model = nbdist.prepare(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
dl = nbdist.loader(FILES, batch_size=32, num_workers=2, seed=7, shuffle_window=256)
trained = 0
"""
EPOCHS = """
import os, psutil, time
for epoch in range(N):
    for b in dl:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(b["x"]).squeeze(1), b["y"]).backward()
        opt.step()
        trained += 1
        time.sleep(PAUSE)
trained
"""
WORKERS = "len(psutil.Process(os.getpid()).children())"


def test_a_stop_mid_epoch_leaves_no_loader_workers_and_the_next_cell_trains(cluster, files):
    import _thread
    import random

    cluster.run(PREPARE)
    threading.Timer(random.uniform(1.0, 3.0), _thread.interrupt_main).start()
    with pytest.raises(KeyboardInterrupt):
        cluster.run("N, PAUSE = 1000, 0.01\n" + EPOCHS, CellOptions(timeout=120))
    stopped_at = cluster.run("trained")
    assert stopped_at > 0
    # the stopped epoch's loader workers are gone, not waiting for a traceback to be freed
    wait_until(lambda: cluster.run("import os, psutil\n" + WORKERS) == 0, 30, what="workers gone")
    epoch = math.ceil(math.ceil(ROWS / 2) / 32)
    assert cluster.run("N, PAUSE = 1, 0\n" + EPOCHS, CellOptions(timeout=120)) == stopped_at + epoch


def test_ranks_that_see_different_files_are_told_in_one_line(cluster, files):
    cell = "nbdist.loader(FILES if nbdist.rank() == 0 else FILES.replace('*', '[0-2]*'), 8)"
    with pytest.raises(DistributedCellError) as e:
        cluster.run(cell, CellOptions(timeout=60))
    text = str(e.value)
    assert "the ranks see different data (rank 0: 5 files, 3,208 rows; rank 1: 3 files" in text
