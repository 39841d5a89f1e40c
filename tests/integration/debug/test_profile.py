"""``%%distributed --profile``: torch.profiler on every rank of a real cluster, one rank made slow
on purpose; the table's row per rank, the straggler it names and why, the merged Chrome trace
(a process per rank), the dashboard's bars; bad input in one line."""

from __future__ import annotations

import json

import pytest

SLOW = """%%distributed --profile {steps} --name profiled
import time, torch
torch.manual_seed(0)
nn = torch.nn
model = nbdist.prepare(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
pairs = torch.utils.data.TensorDataset(torch.randn(512, 64), torch.randn(512, 1))
data = torch.utils.data.DataLoader(pairs, batch_size=32)
for step, (x, y) in enumerate(data):
    if nbdist.rank() == 1:
        time.sleep(0.03)  # rank 1 computes 30 ms more per step: the others wait for it
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    nbdist.report(step=step, loss=loss.item(), samples=32)
"""


@pytest.fixture(scope="module")
def ready(ready):
    """The kernel with a cluster (integration/conftest.py), ``nbdist`` imported in it."""
    ready.ok("import nbdist")
    return ready


def test_the_profile_names_the_rank_the_others_wait_for(ready):
    res = ready.ok(SLOW.format(steps=10))
    assert "straggler: rank 1, computing" in res.stdout and "(rank 0 wait" in res.stdout
    rows = json.loads(
        ready.ok(
            "import dataclasses, json\n"
            "print(json.dumps([dataclasses.asdict(r) for r in nbdist.profile().table]))"
        ).stdout
    )
    assert [r["rank"] for r in rows] == [0, 1] and [r["steps"] for r in rows] == [10, 10]
    slow, fast = rows[1], rows[0]
    assert slow["compute_ms"] > fast["compute_ms"] + 20  # the 30 ms it sleeps, per step
    assert fast["wait_ms"] > slow["wait_ms"] + 20  # rank 0 waits for it in the all-reduce
    assert all(r["data_ms"] > 0 for r in rows)  # the DataLoader is seen
    straggler, trace = json.loads(
        ready.ok(
            "print(json.dumps([nbdist.profile().straggler, str(nbdist.profile().trace)]))"
        ).stdout
    )
    assert straggler == 1
    events = json.load(open(trace))["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}  # one trace, a process per rank
    # DDP's gradients, all-reduced through shared memory on one host (gloo's elsewhere)
    assert any(e.get("name", "").startswith("nbdist_shm:all_reduce") for e in events)
    # the dashboard's bars, one per rank, the straggler marked
    shown = json.loads(
        ready.ok(
            "from nbdist.notebook.run.observers import dashboard as boards\n"
            "print(json.dumps(boards.last().dashboard.widget.history['profile']))"
        ).stdout
    )
    assert shown["straggler"] == 1 and len(shown["rows"]) == 2


# Rank 1's batches come 40 ms late (its loader's iterator timed as nbdist's loaders time theirs,
# no DataLoader in sight): rank 0 waits as long for it in each step's all-reduce.
STARVED = """%%distributed --profile 10 --name starved
import time, torch
from nbdist.worker.reporting.datawait import timed
torch.manual_seed(0)
model = nbdist.prepare(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

def batches(n):
    for _ in range(n):
        if nbdist.rank() == 1:
            time.sleep(0.04)
        yield torch.randn(4, 8), torch.randn(4, 1)

for step, (x, y) in enumerate(timed(batches(16))):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    nbdist.report(step=step, loss=loss.item(), samples=4)
"""


def test_a_rank_starved_by_its_input_is_told_from_one_computing_or_in_collectives(ready):
    res = ready.ok(STARVED)
    assert "straggler: rank 1, waiting for data" in res.stdout, res.stdout
    rows = json.loads(
        ready.ok(
            "import json\n"
            "print(json.dumps([(r.data_ms, r.wait_ms, r.mostly) for r in nbdist.profile().table]))"
        ).stdout
    )
    (fast_data, fast_wait, fast), (slow_data, slow_wait, slow) = rows
    assert (fast, slow) == ("in collectives", "waiting for data")
    assert slow_data > 30 and fast_data < 5  # the 40 ms it waits for each batch, per step
    assert fast_wait > slow_wait + 20  # rank 0 waits for it in the all-reduce
    table = res.stdout.splitlines()
    assert any(line.split()[:1] == ["1"] and line.endswith("waiting for data") for line in table)


def test_a_profile_of_the_whole_cell_and_nothing_when_not_asked(ready):
    res = ready.ok(SLOW.format(steps="").replace("--profile ", "--profile"))
    assert "straggler: rank 1" in res.stdout
    plain = ready.ok(SLOW.replace("--profile {steps} ", ""))
    assert "straggler" not in plain.stdout and "ms per step" not in plain.stdout


@pytest.mark.parametrize(
    "line, message",
    [
        ("%%distributed --profile 0\nx = 1", "--profile STEPS must be a whole number >= 1, not 0"),
        ("%%distributed --profile many\nx = 1", "expected a number of steps, not 'many'"),
    ],
)
def test_bad_profile_options_are_one_line(ready, line, message):
    res = ready.run(line)
    assert res.error is not None and res.error["ename"] == "UsageError"
    assert message in res.error["evalue"]


def test_no_profile_yet_says_how_to_make_one(ready):
    res = ready.run(
        "from nbdist.notebook.debug import profile; profile._last = None\nnbdist.profile()"
    )
    assert res.error["evalue"] == "no profile yet: run a cell with %%distributed --profile [STEPS]"
