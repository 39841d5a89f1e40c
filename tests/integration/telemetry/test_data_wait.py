"""A rank starved by its input, on a real 2-rank cluster: rank 1's map-style Dataset sleeps in
``__getitem__``, so ``nbdist.loader``'s batches keep it waiting most of each step; rank 0's come
at once. Its data share is clearly higher in the health samples, on the board's rows and in the
run store (the latest row and the history); a cell with no loader has none."""

from __future__ import annotations

import pytest
from clusters import board_of, store_of, watched

from nbdist.config import CellOptions

pytestmark = pytest.mark.usefixtures("no_front_end")

# Both ranks step every 40 ms or so: rank 0 computes it all, rank 1 waits 30 ms of it for its
# batch (about 75 %).
STARVED = """
import time, torch

class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 160

    def __getitem__(self, i):
        if nbdist.rank() == 1:
            time.sleep(0.03)
        return torch.tensor([float(i)])

batches = nbdist.loader(Slow(), 1, shuffle=False)
for step, x in enumerate(batches):
    time.sleep(0.04 if nbdist.rank() == 0 else 0.01)
    nbdist.report(step=step, loss=float(x.sum()), samples=1)
"""


def test_the_rank_waiting_for_its_batches_has_the_higher_data_share(cluster):
    mon = watched(cluster, STARVED, CellOptions())
    cluster.run(STARVED, CellOptions(), watch=mon)
    col = mon.collector
    assert col.ranks[0].step == col.ranks[1].step == 79  # 80 batches each
    shares = {r: st.health.data_share for r, st in col.ranks.items()}
    assert shares[1] > 0.5 and shares[0] < 0.2, shares
    rows = {row["rank"]: row for row in board_of(mon).dashboard.rows}
    assert rows[1]["data"] > 50 and rows[0]["data"] < 20, rows
    store = store_of(mon)
    latest = {h["rank"]: h["data_share"] for h in store.health(mon.run_id)}
    assert latest[1] > 0.5 and latest[0] < 0.2, latest
    history: dict[int, list[float]] = {0: [], 1: []}
    for h in store.health_history(mon.run_id):
        if h["data_share"] is not None:
            history[h["rank"]].append(h["data_share"])
    assert len(history[1]) >= 2 and len(history[0]) >= 2  # the cell lasts about 3 s
    assert min(history[1]) > 0.5 and max(history[0]) < 0.2, history


def test_a_cell_without_a_loader_has_no_data_share(cluster):
    src = (
        "import time\nfor i in range(5):\n    nbdist.report(step=i, loss=1.0)\n    time.sleep(0.1)"
    )
    mon = watched(cluster, src, CellOptions())
    cluster.run(src, CellOptions(), watch=mon)
    assert [st.health.data_share for st in mon.collector.ranks.values()] == [None, None]
    assert [h["data_share"] for h in store_of(mon).health(mon.run_id)] == [None, None]
    assert [row["data"] for row in board_of(mon).dashboard.rows] == [None, None]
