"""The board after a recovery, on a real 2-engine cluster with a real SIGKILL: one story told.

Rank 1's engine is killed mid-cell; ``--restarts 1`` puts a fresh engine in its place and the
cell runs again from its last checkpoint to the end. The dashboard (its widget built and updated;
no front end draws it here) and the run store then agree: every rank done, rank 1 on its fresh
engine's pid with its history kept, the events of the failure and the recovery kept in view, and
the time spent recovering a span with no samples/s drawn across it.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest
from clusters import board_of, logged_steps, store_of, watched
from processes import assert_gone, wait_until

from nbdist.config import CellOptions, TelemetryConfig

STEPS, EVERY, KILL_AT = 40, 5, 12

# A training loop that resumes itself from its checkpoints, reports each step and, past step
# KILL_AT, six ordinary events (as sync= training's drift reports are: many of them after the
# recovery), and logs each step rank 0 computes.
TRAIN = f"""
import time, torch
from nbdist.worker.reporting.calls import event
torch.manual_seed(0)
model = nbdist.prepare(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(nbdist.rank())
for step in nbdist.steps({STEPS}, every={EVERY}, model=model, opt=opt, gen=g):
    x = torch.randn(8, 4, generator=g)
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    loss.backward()
    opt.step()
    nbdist.report(step=step, loss=loss.item(), samples=8, total={STEPS})
    for _ in range(6 if step > {KILL_AT} else 0):
        event("sync", f"step {{step}}")
    if nbdist.rank() == 0:
        with open(LOG, "a") as f:
            f.write(f"{{step}}\\n")
    time.sleep(0.05)
"""

# dashboards are built and updated (their widgets too), but there is no front end here
pytestmark = pytest.mark.usefixtures("no_front_end")


def test_the_board_after_a_recovery_tells_one_story(cluster, tmp_path):
    log = tmp_path / "steps.log"
    cluster.run(f"LOG = {str(log)!r}")
    victim, peer = cluster.slots[1].pid, cluster.slots[0].pid
    killed = threading.Event()
    opts = CellOptions(restarts=1, total=STEPS)
    watch = watched(cluster, TRAIN, opts, cfg=TelemetryConfig(silent_after=10.0))
    reported = []  # rank 1's samples on the board when its engine was killed
    reached = []  # the steps rank 0 had logged then

    def kill():
        def due() -> bool:  # the step reached, and something of rank 1's on the board
            return len(logged_steps(log)) >= KILL_AT and watch.collector.ranks[1].samples > 0

        wait_until(due, 60, what="training to reach a step")
        reported.append(watch.collector.ranks[1].samples)
        reached.append(len(logged_steps(log)))
        os.kill(victim, signal.SIGKILL)
        killed.set()

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    cluster.run(TRAIN, opts, watch=watch)
    killer.join(5)
    assert killed.is_set(), "rank 1 was never killed"
    assert_gone([victim])
    fresh = cluster.slots[1].pid
    assert fresh != victim and cluster.slots[0].pid == peer

    dashboard = board_of(watch).dashboard
    history = dashboard.widget.history
    # the workers: both ranks done, rank 1 on its fresh engine, one row each, history kept
    rows = [(r["rank"], r["state"], r["pid"], r["replaced"], r["steps"]) for r in history["rows"]]
    assert rows == [(0, "done", peer, [], STEPS), (1, "done", fresh, [victim], STEPS)]
    assert dashboard.head["status"] == "ok" and dashboard.head["steps"] == STEPS
    # both attempts' samples (the second redoes at least the steps after the one reached at the
    # kill: rank 1 may be a step ahead of rank 0's log), and its curve from its first step
    assert watch.collector.ranks[1].samples >= reported[0] + 8 * (STEPS - reached[0] - 1)
    assert min(watch.collector.series.ranks["loss"][1].x) == 0
    # the events that tell the failure and the recovery, kept in view past the ordinary ones
    shown = [(e["kind"], e["rank"]) for e in history["events"]]
    ordinary = [k for k in shown if k[0] == "sync"]
    assert len(ordinary) >= 40, "not enough ordinary events to push the story out"
    story = [k for k in shown if k[0] in ("died", "failure", "restart", "replaced")]
    assert story == [("died", 1), ("failure", 1), ("restart", None), ("replaced", 1)]
    message = next(e["message"] for e in history["events"] if e["kind"] == "replaced")
    assert message == f"a fresh engine (pid {fresh}) in place of pid {victim}"
    # the time spent recovering: one span, and no samples/s drawn inside it
    [(start, end)] = history["recovering"]
    assert 0 < start < end <= history["rate"][0][-1]
    xs = dashboard.rate.x
    # the span opens at the last figure before it (or later): that one may lie on its edge
    assert [x for x in xs if x <= start] and [x for x in xs if x > end]
    assert not [x for x in xs if start < x <= end], (start, end, xs)
    # what the sidebar shows of the run says the same
    store = store_of(watch)
    assert {h["rank"]: h["state"] for h in store.health(watch.run_id)} == {0: "done", 1: "done"}
    assert store.get_run(watch.run_id)["status"] == "ok"
