"""Telemetry end to end on real clusters: report(), health, verdicts, the run store, tensorboard."""

from __future__ import annotations

import dataclasses
import time

import pytest
from clusters import board_of, store_of, watched
from processes import wait_until

import nbdist
from nbdist.config import CellOptions, TelemetryConfig
from nbdist.errors import DistributedCellError, UsageError
from nbdist.notebook.board import runs
from nbdist.notebook.run.observers.base import Observer
from nbdist.telemetry import events as ev
from nbdist.telemetry.store import RunStore

CFG = TelemetryConfig(silent_after=1.0, slow_factor=2.0)


# dashboards are built and updated (their widgets too), but there is no front end here
pytestmark = pytest.mark.usefixtures("no_front_end")


def _monitor(cluster, source, cfg=CFG, opts=None, extra=(), **kw):
    opts = dataclasses.replace(opts or CellOptions(), **kw)
    return watched(cluster, source, opts, cfg=cfg, extra=extra), opts


def test_reports_and_health_arrive_tied_to_the_cell(cluster):
    src = (
        "import time\n"
        "for i in range(20):\n"
        "    nbdist.report(step=i, loss=float(nbdist.rank() + 1) / (i + 1), samples=4, total=20,"
        " lr=0.5)\n"
        "    time.sleep(0.02)\n"
    )
    mon, opts = _monitor(cluster, src)
    cluster.run(src, opts, watch=mon)
    col = mon.collector
    assert col.records == 40 and col.total == 20 and col.done() == 20
    for r in (0, 1):
        st = col.ranks[r]
        assert st.step == 19 and st.loss == pytest.approx((r + 1) / 20)
        assert st.health.pid == cluster.slots[r].pid  # the engine's own pid, not its parent's
        assert st.health.reports == 20 and st.health.step_time > 0
        assert st.state == ev.DONE  # the cell ended well on it
    store = store_of(mon)
    rows = store.metrics(mon.run_id)
    assert len(rows) == 40 and rows[0]["extra"] == {"lr": 0.5}
    assert {h["rank"]: h["state"] for h in store.health(mon.run_id)} == {0: "done", 1: "done"}
    assert store.get_run(mon.run_id)["step"] == 20
    assert max(board_of(mon).latencies) < 5.0


def test_health_flows_without_report(cluster):
    src = "import time\ntime.sleep(1.2)\n"
    mon, opts = _monitor(cluster, src)
    cluster.run(src, opts, watch=mon)
    for st in mon.collector.ranks.values():
        assert st.health.rss > 10_000_000 and st.reports == 0
        assert st.last_seen is not None
    assert board_of(mon).dashboard is None  # a cell that never reports gets no dashboard
    assert len(store_of(mon).health(mon.run_id)) == 2


_BATCHES = "from nbdist.worker.reporting import sender as _s\n_s.engine.seq"  # batches sent so far


def test_a_cell_nobody_watches_sends_nothing_and_one_watched_briefly_sends_one_batch(cluster):
    """Every batch costs the controller and the kernel's client thread about a millisecond:
    ``Cluster.run`` with no observer sends none (report() is a no-op there), and a watched cell
    shorter than the reporter's interval sends one, at its end, with its records and health."""
    src = "for i in range(50):\n    nbdist.report(step=i, loss=1.0)\n"
    before = cluster.run(_BATCHES)
    cluster.run(src)
    assert cluster.run(_BATCHES) == before
    mon, opts = _monitor(cluster, src)
    cluster.run(src, opts, watch=mon)
    assert cluster.run(_BATCHES) == before + 1
    assert mon.collector.records == 100  # both ranks' 50 records, in that one batch each
    assert all(st.health is not None for st in mon.collector.ranks.values())


def test_refresh_sets_the_ranks_and_the_boards_pace(cluster):
    """``--refresh SECONDS``, declared once (config.CellOptions), reaches the engines (a batch
    per period, not per half second) and the board (its redraws at that pace); the ranks keep
    reading ok, not silent, between their batches."""
    src = (
        "import time\nfor i in range(40):\n    nbdist.report(step=i, loss=1.0)\n"
        "    time.sleep(0.1)\n"
    )
    sent = {}
    for refresh in (0.5, 2.0):
        before = cluster.run(_BATCHES)
        mon, opts = _monitor(cluster, src, refresh=refresh)
        cluster.run(src, opts, watch=mon)
        sent[refresh] = cluster.run(_BATCHES) - before
        assert mon.collector.records == 80
        assert not [e for e in mon.events if e.kind == "silent"]
        updates = board_of(mon).dashboard.updates
        assert updates <= 4 / refresh + 3, (refresh, updates)  # a 4 s cell: its pace, and the end
    assert sent[0.5] >= 6 and sent[2.0] <= 3, sent


def test_a_bad_refresh_is_one_line():
    with pytest.raises(UsageError, match=r"--refresh must be a number of seconds >= 0.1"):
        CellOptions(refresh=0)
    with pytest.raises(UsageError, match=r"--refresh must be at most 60 s"):
        CellOptions(refresh=90)
    with pytest.raises(UsageError, match=r"--progress-timeout must be a number of seconds >= 40"):
        CellOptions(refresh=10, progress_timeout=30)


def test_bad_report_arguments_fail_the_cell_with_one_line(cluster):
    with pytest.raises(DistributedCellError, match=r"step must be a whole number, not 'x'"):
        cluster.run("nbdist.report(step='x', loss=1.0)")
    with pytest.raises(DistributedCellError, match=r"metric lr must be a number"):
        cluster.run("nbdist.report(step=1, lr='fast')")


def test_metrics_written_as_people_write_them_are_taken_as_the_loss_is(cluster):
    """``acc=(pred == y).float().mean()``, a numpy scalar, a 0-d count: numbers on the board and
    in the store, on every rank; a tensor of several values is one line saying to reduce it."""
    src = (
        "import numpy as np, torch\n"
        "pred, y = torch.tensor([1, 2, 3, 4]), torch.tensor([1, 2, 0, nbdist.rank()])\n"
        "for i in range(3):\n"
        "    nbdist.report(step=i, loss=torch.tensor(0.5), acc=(pred == y).float().mean(),\n"
        "                  lr=np.float32(0.25), hits=(pred == y).sum(), grad=np.array(1.5))\n"
    )
    mon, opts = _monitor(cluster, src)
    cluster.run(src, opts, watch=mon)
    rows = store_of(mon).metrics(mon.run_id)
    assert len(rows) == 6
    extra = {r["rank"]: r["extra"] for r in rows if r["step"] == 2}
    assert extra == {
        0: {"acc": 0.5, "lr": 0.25, "hits": 2.0, "grad": 1.5},
        1: {"acc": 0.5, "lr": 0.25, "hits": 2.0, "grad": 1.5},
    }
    assert mon.collector.series.ranks["acc"][1].y == [0.5, 0.5, 0.5]
    with pytest.raises(DistributedCellError, match=r"metric acc must have one element, not shape"):
        cluster.run("import torch\nnbdist.report(step=1, acc=torch.ones(3))")


def test_report_outside_an_engine_is_a_usage_error():
    with pytest.raises(UsageError, match="runs on nbdist engines only"):
        nbdist.report(step=1, loss=0.5)


def test_a_rank_that_never_reports_blocks_nobody_and_reads_silent(cluster):
    src = (
        "import time\n"
        "if nbdist.rank() == 0:\n"
        "    for i in range(40):\n"
        "        nbdist.report(step=i, loss=1.0, total=40)\n"
        "        time.sleep(0.05)\n"
        "else:\n"
        "    time.sleep(2.0)\n"
    )
    states = {0: set(), 1: set()}

    class Seen(Observer):  # a second observer: what each rank's state was at every judgement
        def on_tick(self, tick):
            for r in (0, 1):
                states[r].add(tick.live.ranks[r].state)

    mon, opts = _monitor(cluster, src, extra=[Seen()])
    cluster.run(src, opts, watch=mon)
    assert mon.collector.done() == 40
    assert states == {0: {ev.OK}, 1: {ev.OK, ev.SILENT}}
    assert any(e.kind == "silent" and e.rank == 1 for e in mon.events)


def test_nan_is_flagged_and_can_stop_every_rank(cluster):
    src = (
        "import time\n"
        "for i in range(400):\n"
        "    bad = nbdist.rank() == 1 and i == 5\n"
        "    nbdist.report(step=i, loss=float('nan') if bad else 1.0)\n"
        "    time.sleep(0.02)\n"
    )
    mon, opts = _monitor(cluster, src, stop_on_nan=True)
    t0 = time.monotonic()
    with pytest.raises(DistributedCellError, match=r"rank 1: loss is not finite: .* at step 5"):
        cluster.run(src, opts, watch=mon)
    assert time.monotonic() - t0 < 6.0  # 400 steps would take 8 s
    nan = [e for e in mon.events if e.kind == "nan"]
    assert len(nan) == 1 and nan[0].rank == 1
    assert [r["loss"] for r in board_of(mon).dashboard.rows] == [
        1.0,
        "nan",
    ]  # shown as text, not NaN
    run = store_of(mon).get_run(mon.run_id)
    assert run["status"] == "stopped" and run["nonfinite"] == "nan"
    # the cluster is usable again afterwards
    assert cluster.run("nbdist.rank() + 1") == 1


def test_a_dead_rank_reads_dead(cluster):
    src = (
        "import os, time\n"
        "for i in range(10):\n"
        "    nbdist.report(step=i, loss=1.0)\n"
        "    time.sleep(0.05)\n"
        "if nbdist.rank() == 1:\n"
        "    os._exit(3)\n"
        "time.sleep(30)\n"
    )
    mon, opts = _monitor(cluster, src, opts=CellOptions(grace=0.5))
    with pytest.raises(DistributedCellError):
        cluster.run(src, opts, watch=mon)
    assert mon.collector.ranks[1].state == ev.DEAD
    assert mon.collector.ranks[0].state == ev.STOPPED  # by its peer's death, not by itself
    assert [e.rank for e in mon.events if e.kind == "died"] == [1]
    store = store_of(mon)
    assert {h["rank"]: h["state"] for h in store.health(mon.run_id)}[1] == "dead"
    run = store.get_run(mon.run_id)
    assert run["status"] == "failed" and any(f["rank"] == 1 for f in run["failures"])
    wait_until(lambda: cluster.run("nbdist.rank()") == 0, 60, what="the repaired cluster")


def test_comm_share_comes_from_ddp(cluster):
    src = (
        "import torch\n"
        "ddp_model = nbdist.prepare(torch.nn.Linear(256, 256))\n"
        "opt = torch.optim.SGD(ddp_model.parameters(), lr=0.01)\n"
        "for i in range(40):\n"
        "    loss = ddp_model(torch.randn(32, 256)).pow(2).mean()\n"
        "    loss.backward(); opt.step(); opt.zero_grad()\n"
        "    nbdist.report(step=i, loss=loss, samples=32)\n"
    )
    mon, opts = _monitor(cluster, src)
    cluster.run(src, opts, watch=mon)
    for st in mon.collector.ranks.values():
        share = st.health.comm_share
        assert share is not None and 0.0 <= share < 1.0
        assert st.loss is not None and st.step == 39  # a tensor loss, read off the main thread


# -- afterwards: runs(), metrics, compare ---------------------------------------------------------
def _kept(tmp_path) -> RunStore:
    store = RunStore(tmp_path / "runs.sqlite")
    for scale in (1.0, 2.0):
        rid = store.start_run(name=f"x{scale}", world_size=2)
        store.add_metrics(
            rid,
            [
                {
                    "time": 1.0 + i,
                    "rank": r,
                    "step": i,
                    "loss": scale / (i + 1),
                    "samples": 8,
                    "extra": {"lr": 0.1, **({"acc": scale * i / 10} if i % 2 == 0 else {})},
                }
                for i in range(5)
                for r in (0, 1)
            ]
            + [{"time": 9.0, "rank": 1, "step": 5, "loss": float("inf")}],
        )
        store.end_run(rid, "ok")
    return store


def test_runs_lists_and_returns_metrics_as_plain_data(tmp_path, monkeypatch):
    store = _kept(tmp_path)
    listed = runs.runs(store=store)
    assert [r["name"] for r in listed] == ["x2.0", "x1.0"]
    assert "ok" in repr(listed) and "x" not in repr(runs.runs(store=RunStore(tmp_path / "no")))
    monkeypatch.setitem(__import__("sys").modules, "pandas", None)  # as if not installed
    rows = listed[1].metrics()
    assert isinstance(rows, list) and len(rows) == 11
    assert rows[0] == {
        "id": rows[0]["id"],
        "time": 1.0,
        "rank": 0,
        "step": 0,
        "loss": 1.0,
        "samples": 8.0,
        "lr": 0.1,
        "acc": 0.0,
    }
    assert rows[-1]["loss"] == float("inf")
    assert listed[1].loss_curve() == ([0, 1, 2, 3, 4], [1.0, 0.5, 1 / 3, 0.25, 0.2])
    with pytest.raises(UsageError, match="needs pandas"):
        listed[1].metrics(as_frame=True)


def test_metrics_as_a_dataframe_where_pandas_is_installed(tmp_path):
    pd = pytest.importorskip("pandas")
    frame = runs.runs(store=_kept(tmp_path))[0].metrics()
    assert isinstance(frame, pd.DataFrame) and len(frame) == 11
    assert frame.groupby("rank")["loss"].count().to_dict() == {0: 5, 1: 6}


def test_compare_draws_each_run(tmp_path):
    store = _kept(tmp_path)
    a, b = runs.runs(store=store)
    fig = runs.compare(a, b.id, store=store)
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.lines] == [f"run {a.id} x2.0", f"run {b.id} x1.0"]
    assert list(ax.lines[0].get_ydata()) == [2.0, 1.0, 2 / 3, 0.5, 0.4]
    assert fig._repr_png_()[:4] == b"\x89PNG"
    per_rank = runs.compare([a], store=store, per_rank=True)
    assert len(per_rank.axes[0].lines) == 2
    with pytest.raises(UsageError, match="compare\\(\\) needs at least one run"):
        runs.compare(store=store)
    with pytest.raises(UsageError, match="takes runs or run ids, not 'a'"):
        runs.compare("a", store=store)


def test_compare_draws_any_metric_on_a_linear_or_log_axis(tmp_path):
    """``acc`` is reported every other step: its own curve, its axis named after it."""
    store = _kept(tmp_path)
    a, b = runs.runs(store=store)
    fig = runs.compare(a, b, metric="acc", store=store)
    ax = fig.axes[0]
    assert ax.get_ylabel() == "acc" and ax.get_yscale() == "linear"
    assert [list(line.get_xdata()) for line in ax.lines] == [[0, 2, 4]] * 2
    assert list(ax.lines[0].get_ydata()) == pytest.approx([0.0, 0.4, 0.8])
    assert runs.compare(a, metric="loss", log=True, store=store).axes[0].get_yscale() == "log"
    # acc starts at 0: a log axis cannot show it, a symmetric log one can
    assert runs.compare(a, metric="acc", log=True, store=store).axes[0].get_yscale() == "symlog"
    assert a.curve("lr") == ([0, 1, 2, 3, 4], [0.1] * 5)
    with pytest.raises(UsageError, match="has no metric 'f1': it reported loss, lr, acc"):
        runs.compare(a, metric="f1", store=store)


def test_tensorboard_event_files(cluster, tmp_path):
    pytest.importorskip("torch.utils.tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    src = "for i in range(10):\n    nbdist.report(step=i, loss=1.0 / (i + 1), lr=0.1)\n"
    mon, opts = _monitor(cluster, src, tensorboard=str(tmp_path / "tb"))
    cluster.run(src, opts, watch=mon)
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert {"loss/rank0", "loss/rank1", "lr/rank0", "loss/mean"} <= set(acc.Tags()["scalars"])
    assert [e.step for e in acc.Scalars("loss/rank1")] == list(range(10))


def test_tensorboard_without_the_package_is_one_clear_error(cluster, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "torch.utils.tensorboard", None)
    with pytest.raises(UsageError, match="--tensorboard needs the tensorboard package"):
        _monitor(cluster, "x = 1", tensorboard="/tmp/nowhere")
