"""Sweeps on a real 2-engine cluster: trials in groups of their own, as many at once as there are
blocks of ranks; a trial equals a plain run of the same cell; failure, NaN, a lost engine and the
median rule end one trial, never the sweep; the cluster is whole again afterwards."""

from __future__ import annotations

import time

import numpy as np
import pytest
from processes import assert_gone

from nbdist.errors import UsageError
from nbdist.notebook.sweeps.trials import pull_trial, sweep

WHO = """
import os, time, torch, torch.distributed as dist
t = torch.ones(1)
dist.all_reduce(t)
info = nbdist.trial()
began = time.time()
nbdist.report(step=0, loss=lr)
time.sleep(0.6)
seen = (info.trial, dict(info.values), lr, nbdist.rank(), nbdist.world_size(), t.item(),
        os.environ["RANK"], os.environ["WORLD_SIZE"], began, time.time())
"""


def test_trials_run_at_once_each_in_a_group_of_its_own(cluster):
    table = sweep(WHO, {"lr": [0.1, 0.2, 0.3, 0.4]}, trial_size=1, name="who", board=False)
    assert [r.state for r in table] == ["done"] * 4
    assert sorted({r.ranks for r in table}) == [(0,), (1,)]
    seen = pull_trial("seen", "best")  # the lowest loss: lr=0.1's
    assert seen[:8] == (0, {"lr": 0.1}, 0.1, 0, 1, 1.0, "0", "1")  # the trial's own group
    with pytest.raises(UsageError, match="trial 1 did not bind 'seen'"):
        pull_trial("seen", 1)
    # two trials ran at once: the runs the store keeps for the first two overlap in time
    import nbdist

    spans = {r.id: (r["started"], r["ended"]) for r in nbdist.runs(limit=10)}
    (a0, a1), (b0, b1) = spans[table[0].run_id], spans[table[1].run_id]
    assert a0 < b1 and b0 < a1, spans
    # after the sweep the next cell has the whole group again
    whole = "import torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\n"
    assert cluster.run(whole + "(nbdist.world_size(), t.item())") == (2, 2.0)


TRAIN = """
import torch, torch.nn.functional as F
torch.manual_seed(0)
model = nbdist.prepare(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=lr)
g = torch.Generator().manual_seed(nbdist.rank())
for step in range(20):
    x = torch.randn(8, 4, generator=g)
    opt.zero_grad()
    loss = F.mse_loss(model(x), x.sum(1, keepdim=True))
    loss.backward()
    opt.step()
    nbdist.report(step=step, loss=loss)
params = [p.detach().clone() for p in model.parameters()]
"""


def test_a_trial_equals_a_plain_run_of_the_same_cell(cluster):
    table = sweep(TRAIN, {"lr": [0.05, 0.01]}, trial_size=2, name="same", board=False)
    assert [r.state for r in table] == ["done", "done"] and table[0].ranks == (0, 1)
    best = table.row("best")
    assert best.trial == 0 and best.best < table[1].best  # the larger rate learned faster
    got = pull_trial("params", "best")
    cluster.run(f"lr = {best.values['lr']}")
    want = cluster.run(TRAIN + "params")
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    from nbdist import trials

    stored = trials("same")
    assert [(r.trial, r.values, r.state) for r in stored] == [
        (0, {"lr": 0.05}, "done"),
        (1, {"lr": 0.01}, "done"),
    ]
    assert stored[0].best == pytest.approx(best.best) and stored[0].run_id == best.run_id


FAILING = """
import time, math
for step in range(12):
    if lr == 0.2 and step == 3:
        raise ValueError("lr 0.2 diverged")
    nbdist.report(step=step, loss=float("nan") if lr == 0.3 and step == 4 else lr)
    time.sleep(0.05)
"""


def test_an_error_or_a_nan_ends_its_trial_alone(cluster):
    table = sweep(FAILING, {"lr": [0.1, 0.2, 0.3, 0.4]}, trial_size=1, stop_on_nan=True)
    states = {r.values["lr"]: (r.state, r.note) for r in table}
    assert states[0.1] == ("done", "") and states[0.4] == ("done", "")
    assert states[0.2] == ("failed", "rank 0: ValueError: lr 0.2 diverged")
    assert states[0.3][0] == "stopped" and "loss is nan at step 4" in states[0.3][1]
    assert cluster.run("1 + 1") == 2


def test_a_mesh_in_a_trial_is_one_line(cluster):
    table = sweep("mesh = nbdist.mesh(dp=2)", {"lr": [0.1]}, trial_size=2)
    [row] = list(table)
    assert row.state == "failed" and "a sweep's trials each train on their own ranks" in row.note
    assert "\n" not in row.note


DYING = """
import os, signal, time
for step in nbdist.steps(10, every=2, state=progress):
    if lr == 0.1 and step == 5 and nbdist.trial().attempt == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    progress["done"] = progress.get("done", 0) + 1
    nbdist.report(step=step, loss=1.0 / (step + 1))
    time.sleep(0.05)
first_step = 10 - progress["done"]
"""


def test_a_lost_engine_restarts_its_trial_from_its_checkpoint(cluster):
    cluster.run("progress = {}")
    pids = [s.pid for s in cluster.slots]
    table = sweep(DYING, {"lr": [0.1, 0.2]}, trial_size=1, restarts=1, name="dying", board=False)
    assert [r.state for r in table] == ["done", "done"]
    # the lost engine's block was retired: trial 0 finished on the other rank
    assert table[0].ranks == (1,)
    assert table[0].step == 9
    lost = [p for p, s in zip(pids, cluster.slots, strict=True) if s.pid != p]
    assert len(lost) == 1
    assert_gone(lost)
    whole = "import torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\n"
    assert cluster.run(whole + "t.item()") == 2.0


def test_an_engine_dead_before_the_sweep_leaves_its_trials_to_the_others(cluster):
    import os
    import signal

    from processes import wait_until

    victim = cluster.slots[1].pid
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: victim in cluster.drain_exits(), 10, what="the death to be known")
    table = sweep("x = lr * 2\nnbdist.report(step=0, loss=x)", {"lr": [1, 2, 3]}, board=False)
    assert [(r.state, r.ranks) for r in table] == [("done", (0,))] * 3
    assert cluster.slots[1].pid != victim  # replaced after the sweep
    assert_gone([victim])
    assert cluster.run("import torch.distributed as dist\ndist.get_world_size()") == 2


LEARNING = """
import time
for step in range(30):
    nbdist.report(step=step, loss=lr * (1 + 1 / (step + 1)))
    time.sleep(0.04)
"""


def test_stop_early_median_stops_the_hopeless_trials(cluster):
    t0 = time.monotonic()
    table = sweep(
        LEARNING,
        {"lr": [1, 2, 3, 4]},
        trial_size=1,
        stop_early="median",
        name="median",
        board=False,
    )
    states = [(r.values["lr"], r.state) for r in table]
    assert states == [(1, "done"), (2, "done"), (3, "stopped"), (4, "stopped")], table
    assert all("worse than the median" in r.note for r in table[2:])
    assert all(r.step < 29 for r in table[2:])  # stopped before their end
    assert time.monotonic() - t0 < 30


def test_bad_sweeps_are_one_line_before_anything_runs(cluster):
    with pytest.raises(UsageError, match="--trial-size 3 does not divide the cluster's 2 ranks"):
        sweep("x = 1", {"lr": [1, 2]}, trial_size=3)
    with pytest.raises(UsageError, match="--ranks and --sweep do not mix"):
        sweep("x = 1", {"lr": [1, 2]}, ranks=(0,))


# -- in a notebook: the magic, the board, the pull, the interrupt ----------------------------
SWEEP_CELL = """%%distributed --sweep lr=0.1,0.3 --sweep width=4,8 --trial-size 1 --name kern
import time, torch
model = torch.nn.Linear(width, 1)
for step in range(12):
    nbdist.report(step=step, loss=lr * width / (step + 1), samples=8)
    time.sleep(0.03)
"""


def test_the_magic_sweeps_shows_its_board_and_the_best_trial_is_pulled(kernel):
    kernel.ok("%nbdist start -n 2")
    try:
        res = kernel.ok(SWEEP_CELL)
        boards = [d for d in res.displays if "application/vnd.jupyter.widget-view+json" in d]
        assert len(boards) == 1 and "nbdist sweep" in boards[0]["text/plain"]
        assert res.result.startswith("sweep 'kern': 4 trials"), res.result
        assert res.result.count(" done ") == 4
        kernel.ok("%nbdist pull model --trial best")
        # lr=0.1, width=4 reported the lowest loss: its model is a Linear(4, 1)
        assert kernel.ok("print(model.in_features)").stdout.strip() == "4"
        assert (
            "TrialRow(trial=0, values={'lr': 0.1, 'width': 4}, state='done'"
            in kernel.ok("import nbdist\nprint(nbdist.trials('kern').row('best'))").stdout
        )
        shown = kernel.ok(
            "nbdist.compare(*nbdist.trials('kern').best(2))"
        )  # the best two, overlaid
        assert any("image/png" in d for d in shown.displays) or "Figure" in (shown.result or "")
        bad = kernel.run("%%distributed --sweep lr=1,2 --trial-size 3\nx = 1\n")
        assert bad.error["ename"] == "UsageError"
        assert "--trial-size 3 does not divide the cluster's 2 ranks" in bad.error["evalue"]
        # the interrupt stops every trial, and the cluster is whole for the next cell
        stopped = kernel.run(
            "%%distributed --sweep lr=1,2,3 --trial-size 1 --name long --no-dashboard\n"
            "import time\nfor step in range(2000):\n"
            "    nbdist.report(step=step, loss=lr)\n    time.sleep(0.01)\n",
            interrupt_after=3,
            timeout=60,
        )
        assert stopped.error is not None and stopped.error["ename"] == "CellInterrupted"
        states = kernel.ok("print([r.state for r in nbdist.trials('long')])").stdout
        assert states.strip() == "['stopped', 'stopped']", states  # the third never started
        whole = kernel.ok(
            "%%distributed\nimport torch, torch.distributed as dist\nt = torch.ones(1)\n"
            "dist.all_reduce(t)\nt.item()"
        )
        assert whole.result == "2.0"
    finally:
        kernel.ok("%nbdist stop")


HOLDS = """
import torch
from nbdist.worker.state import engine
held = sorted(engine.trial_spaces)  # the ended trials' names this engine still holds
big = torch.zeros(100_000)
nbdist.report(step=0, loss=lr)
"""


def test_a_long_sweep_holds_one_ended_trials_names_per_engine(cluster):
    lrs = [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]  # each trial better than the last: the last is best
    table = sweep(HOLDS, {"lr": lrs}, trial_size=1, name="holds", board=False)
    assert [r.state for r in table] == ["done"] * 6
    held = pull_trial("held", "best")
    assert len(held) <= 1, held  # not every earlier trial on this engine
    assert pull_trial("big", "best").shape == (100_000,)
    left = cluster.run("from nbdist.worker.state import engine\nsorted(engine.trial_spaces)")
    assert left in ([], [5])  # after the sweep: the best trial's names only
