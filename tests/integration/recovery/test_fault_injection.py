"""Fault injection: the kernel is killed (SIGKILL) at a random moment while a run reports,
checkpoints every other step and the store writes; a new kernel on the same data folder then
finds everything whole: the store opens and passes SQLite's integrity check, the run is listed
with every row that was visible before the kill, the latest good checkpoint loads (nothing
half-written is read), and ``--resume`` continues from it.

A few kills per CI run (``NBDIST_FAULT_KILLS``, default 2; more locally); the moments come from
``NBDIST_FAULT_SEED`` (random by default, and named in any failure, to replay it).
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
from pathlib import Path

import pytest
from kernels import shutdown_kernel, start_kernel
from paths import data_dir_env
from processes import assert_gone, wait_until

from nbdist.telemetry.store import RunStore
from nbdist.worker.checkpoint import files

KILLS = int(os.environ.get("NBDIST_FAULT_KILLS", "2"))
SEED = int(os.environ.get("NBDIST_FAULT_SEED", str(random.randrange(1_000_000))))

TRAIN = """%%distributed --name fault --resume
import torch
torch.manual_seed(0)
model = nbdist.prepare(torch.nn.Linear(64, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 64)
for step in nbdist.steps(1_000_000, every=2, run="fault", model=model, opt=opt):
    opt.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    nbdist.report(step=step, loss=loss, lr=0.01, seen=float(step))
"""


def _rows(db: Path) -> dict[int, int]:
    """Metric rows per run, as a reader sees them now (read-only: the writer is alive)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        return dict(conn.execute("SELECT run_id, COUNT(*) FROM metrics GROUP BY run_id"))


def _newest_checkpoint(folder: Path) -> int:
    done = files.complete(folder) if folder.is_dir() else []
    return done[0][0] if done else -1


def test_a_kernel_killed_at_random_moments_loses_nothing(tmp_path):
    rng = random.Random(SEED)
    data = tmp_path / "data"
    db, folder = data / "runs.sqlite", data / "checkpoints" / "fault"
    seen_rows: dict[int, int] = {}  # what a reader saw just before each kill
    seen_checkpoint = -1
    with data_dir_env(data):
        for kill in range(KILLS + 1):
            why = f"kill {kill} of {KILLS}, NBDIST_FAULT_SEED={SEED}"
            k = start_kernel()
            try:
                k.ok("%nbdist start -n 2")
                if kill:  # what the last kernel left: whole, and every row a reader saw
                    runs = RunStore(db).list_runs(limit=10)
                    assert {r["id"] for r in runs} >= set(seen_rows), why
                    rows = _rows(db)
                    assert all(rows.get(r, 0) >= n for r, n in seen_rows.items()), why
                    with sqlite3.connect(db) as conn:
                        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",), why
                    payload, skipped = files.load_latest(folder)
                    assert payload is not None and skipped == [], (why, skipped)
                    assert payload["step"] >= seen_checkpoint, why
                    resumed_from = payload["step"] + 1
                if kill == KILLS:
                    break
                sent = k.submit(TRAIN)
                before = sum(_rows(db).values()) if db.exists() else 0
                target = before + rng.randrange(10, 60)  # the moment: a random row count
                wait_until(
                    lambda t=target: db.exists() and sum(_rows(db).values()) >= t,
                    90,
                    0.02,
                    what=f"rows to reach {target} ({why})",
                )
                if kill:  # the run went on from its checkpoint, not from step 0
                    first = _first_step_of_newest_run(db)
                    assert first == resumed_from, (why, first, resumed_from)
                pids = k.descendants() + [k.pid]
                seen_rows = _rows(db)
                seen_checkpoint = _newest_checkpoint(folder)
                os.kill(k.pid, signal.SIGKILL)  # mid-report, mid-checkpoint, mid-write
                assert_gone(pids, timeout=30)  # its engines and controller went with it
                k.kc.stop_channels()
                del sent
            except BaseException:
                if k.km.is_alive():
                    shutdown_kernel(k)
                raise
        shutdown_kernel(k)
    assert KILLS >= 1 or pytest.skip("NBDIST_FAULT_KILLS=0")


def _first_step_of_newest_run(db: Path) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        (run_id,) = conn.execute("SELECT MAX(id) FROM runs").fetchone()
        (first,) = conn.execute(
            "SELECT MIN(step) FROM metrics WHERE run_id = ?", (run_id,)
        ).fetchone()
    return first
