"""Elastic recovery of a loader over files: a rank lost mid-epoch that cannot be replaced,
``--min-workers`` goes on with fewer ranks, and the rest of the epoch is split over the ranks
left: no sample read twice, none skipped.

Its own module: it needs a cluster of its own, whose fork server it kills.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import numpy as np
import pytest
from processes import assert_gone, wait_until

from nbdist.config import CellOptions

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

ROWS = 1500

TRAIN = """
import json, time
dl = nbdist.loader(FILES, batch_size=16, num_workers=1, seed=1, shuffle_window=128)
step = nbdist.restore(loader=dl, n={"k": 0}, run="elastic-loader")
for b in dl:  # one epoch: after a restore, the rest of it
    with open(f"{LOG}.{nbdist.rank()}", "a") as f:
        f.write(json.dumps([nbdist.world_size(), step, b["id"].tolist()]) + "\\n")
    nbdist.checkpoint(step, every=5, loader=dl, n={"k": 0}, run="elastic-loader")
    step += 1
    time.sleep(0.05)
nbdist.world_size()
"""


def _entries(log: str) -> list[list]:
    return [
        json.loads(line)
        for p in Path(log).parent.glob(Path(log).name + ".*")
        for line in p.read_text().splitlines()
    ]


def test_min_workers_splits_the_rest_of_the_epoch_over_the_ranks_left(tmp_path):
    import nbdist

    for i, n in enumerate([900, 40, 560]):  # uneven files, ids 0..ROWS-1
        start = [0, 900, 940][i]
        ids = np.arange(start, start + n)
        pq.write_table(pa.table({"id": ids}), tmp_path / f"p{i}.parquet", row_group_size=100)
    c = nbdist.start(n=3)
    pids = [p.pid for p in c.engines.processes()]
    try:
        log = str(tmp_path / "seen")
        c.run(f"FILES, LOG = {str(tmp_path / '*.parquet')!r}, {log!r}")
        victim = c.slots[2].pid

        def inject():
            wait_until(lambda: len(_entries(log)) >= 3 * 12, 90, what="training to step 12")
            c.engines._forks.proc.kill()  # no engine can be started any more
            os.kill(victim, signal.SIGKILL)

        threading.Thread(target=inject, daemon=True).start()
        world = c.run(TRAIN, CellOptions(restarts=1, min_workers=1, timeout=180))
        assert world == 2
        entries = _entries(log)
        after = [e for e in entries if e[0] == 2]
        resumed_at = min(e[1] for e in after)
        before = [e for e in entries if e[0] == 3 and e[1] < resumed_at]
        had = {i for e in before for i in e[2]}
        rest = [i for e in after for i in e[2]]
        assert resumed_at > 0 and resumed_at % 5 == 1  # from the checkpoint, mid-epoch
        assert had | set(rest) == set(range(ROWS))  # none skipped
        assert not had & set(rest)  # none read twice
        # the ranks left share the rest evenly: only the new split's padding repeats
        assert len(rest) - len(set(rest)) < 2 * 16
    finally:
        c.stop()
        assert_gone(pids)
