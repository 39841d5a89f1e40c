"""The telemetry collector and run monitor under simulated publishers: verdicts, NaN, load."""

from __future__ import annotations

import statistics
import threading
import time
from types import SimpleNamespace

import pytest

from nbdist.config import CellOptions, TelemetryConfig
from nbdist.notebook.board.collector import Collector
from nbdist.notebook.board.health import RankState, classify, ending
from nbdist.notebook.run.observers.assembly import assemble
from nbdist.notebook.run.observers.base import Phase
from nbdist.notebook.run.observers.dashboard import Board
from nbdist.notebook.run.observers.watch import Watch
from nbdist.protocol import CellOutcome
from nbdist.telemetry import events as ev
from nbdist.telemetry.events import Batch, HealthSample, MetricRecord
from nbdist.telemetry.store import RunStore

CFG = TelemetryConfig(silent_after=1.0, slow_factor=2.0)


# dashboards are built and updated (their widgets too), but there is no front end here
pytestmark = pytest.mark.usefixtures("no_front_end")


# -- verdicts: a pure function ------------------------------------------------------------------
def _rank(r, **kw) -> RankState:
    return RankState(r, **kw)


def _health(t: float, **kw) -> HealthSample:
    return HealthSample(time=t, host=kw.pop("host", "h"), pid=kw.pop("pid", 1), **kw)


def test_classify_verdicts():
    now, started = 100.0, 90.0
    ranks = {
        0: _rank(
            0, last_seen=99.9, step_time=0.10, reports=5, last_record=99.9, health=_health(99.9)
        ),
        1: _rank(
            1, last_seen=99.9, step_time=0.11, reports=5, last_record=99.8, health=_health(99.9)
        ),
        2: _rank(
            2, last_seen=99.9, step_time=0.35, reports=5, last_record=99.9, health=_health(99.9)
        ),  # a straggler
        3: _rank(3, last_seen=97.0, step_time=0.10, reports=5),  # no heartbeat for 3 s
        4: _rank(4, last_seen=99.9, reports=0),  # alive, never reports, while others do
        5: _rank(5, outcome=ev.DEAD, last_seen=99.9),
        6: _rank(6, outcome=ev.DONE, last_seen=90.0),  # finished: not silent
        7: _rank(7, outcome=ev.FAILED, last_seen=90.0),
    }
    got = classify(ranks, now, started, CFG)
    assert got == {
        0: ev.OK,
        1: ev.OK,
        2: ev.SLOW,
        3: ev.SILENT,
        4: ev.SILENT,
        5: ev.DEAD,
        6: ev.DONE,
        7: ev.FAILED,
    }


def test_a_rank_that_raised_is_failed_and_its_peers_stopped():
    """How a cell ended on each rank, as its tile and its row say it: the rank whose own code
    raised is failed (with its error), those it took down are stopped, not failed."""
    out = [
        (0, CellOutcome("error", 1.0, summary="RuntimeError: Connection closed by peer")),
        (1, CellOutcome("error", 1.0, summary="KeyError: 'b'")),
        (2, CellOutcome("interrupted", 1.0, summary="nbdist: interrupted")),
        (3, CellOutcome("died", 1.0, summary="engine process 7 killed by SIGKILL")),
        (4, CellOutcome("ok", 1.0)),
        (5, CellOutcome("timeout", 1.0, summary="stopped by --timeout")),
    ]
    assert [ending(r, o) for r, o in out] == [
        (ev.STOPPED, None),
        (ev.FAILED, "KeyError: 'b'"),
        (ev.STOPPED, None),
        (ev.DEAD, "engine process 7 killed by SIGKILL"),
        (ev.DONE, None),
        (ev.STOPPED, None),
    ]
    col = Collector([0, 1], CFG, clock=lambda: 1000.0)
    feeds = {r: SimpleNamespace(metadata={"stdout": ""}, outcome=o, pid=r) for r, o in out[:2]}
    col.poll(feeds)
    col.update_states()
    seen = [(e.kind, e.rank, e.message) for e in col.take_news().events]
    assert [col.ranks[r].state for r in (0, 1)] == [ev.STOPPED, ev.FAILED]
    assert seen == [("failed", 1, "KeyError: 'b'")]  # the board's events name it


def test_classify_without_reports_uses_the_heartbeat_only():
    ranks = {0: _rank(0, last_seen=99.5), 1: _rank(1, last_seen=99.5)}
    assert classify(ranks, 100.0, 10.0, CFG) == {0: ev.OK, 1: ev.OK}
    ranks[1].last_seen = 95.0
    assert classify(ranks, 100.0, 10.0, CFG)[1] == ev.SILENT


def test_collector_folds_batches_and_flags_nan_at_once():
    col = Collector([0, 1], CFG, clock=lambda: 1000.0)
    recs0 = [MetricRecord(999.0 + i * 0.1, i, 1.0 / (i + 1), 8, 10, None) for i in range(5)]
    recs1 = [
        MetricRecord(999.0 + i * 0.1, i, 2.0 / (i + 1), 8, None, {"lr": 0.1}) for i in range(4)
    ]
    recs1.append(MetricRecord(999.5, 4, float("nan"), 8, None, None))
    col.ingest(0, Batch(0, 1, 999.5, recs0))
    col.ingest(1, Batch(1, 1, 999.5, recs1, _health(999.5, host="h1")))
    seen = [(e.kind, e.rank, e.message) for e in col.take_news().events]
    assert col.total == 10 and col.done() == 5 and col.records == 10
    assert seen == [("nan", 1, "loss is nan at step 4")]
    assert col.ranks[1].nonfinite == "nan" and col.ranks[1].host == "h1"
    col.settle_mean(final=True)
    mean = col.series.mean["loss"]
    assert mean.x == [0, 1, 2, 3, 4] and mean.y[0] == pytest.approx(1.5)
    assert mean.y[4] == pytest.approx(0.2)  # the NaN is flagged, not averaged in
    lr = col.series.mean["lr"]  # every metric reported has its curve, its mean too
    assert (lr.x, lr.y) == ([0, 1, 2, 3], [0.1] * 4)
    assert col.samples_per_s() == pytest.approx(80 / 0.5)


def test_the_collector_ignores_what_is_not_a_batch_of_its_version():
    col = Collector([0], CFG)
    rec = MetricRecord(1.0, 0, 0.5, None, None, None)
    good, old = Batch(0, 1, 1.0, [rec]), Batch(0, 2, 1.0, [rec], v=ev.VERSION + 1)
    data = {ev.key(9, 1): good, ev.key(9, 2): old, ev.key(9, 3): {"v": ev.VERSION}, "x": 1}
    rk = SimpleNamespace(metadata={"data": data, "stdout": ""}, outcome=None, pid=9)
    assert col.poll({0: rk}) == 1 and col.records == 1
    assert data == {"x": 1}  # nbdist's keys are popped, read or not; others are left alone


# -- scale: 64 simulated ranks, 20 reports a second each -----------------------------------------
def _sim_watch(n: int, store: RunStore) -> Watch:
    return assemble("nbdist.report(...)", CellOptions(), range(n), store_at=store, cfg=CFG)


@pytest.mark.parametrize("n, hz", [(64, 20), (256, 5)])  # issue 4's load; issue 8's 256 ranks
def test_collector_keeps_up_with_many_ranks(tmp_path, n, hz):
    """Publishers do what ipyparallel's client thread does (deserialise, ``data.update``); the
    kernel's loop calls the monitor every 20 ms as the supervisor does. Nothing is lost, the
    backlog stays small, polls stay short, and the store gets every row."""
    from ipyparallel.serialize import deserialize_object, serialize_object

    seconds = 3.0
    ranks = {
        r: SimpleNamespace(rank=r, metadata={"data": {}, "stdout": ""}, outcome=None, pid=r)
        for r in range(n)
    }
    store = RunStore(tmp_path / "runs.sqlite")
    sent = [0]
    stop = threading.Event()

    def publish():
        seq = 0
        t_next = time.monotonic()
        while not stop.is_set():
            now = time.time()
            for r in range(n):
                seq += 1
                body = Batch(
                    r,
                    seq,
                    now,
                    [MetricRecord(now, seq, 1.0 / seq, 32, None, None)],
                    HealthSample(now, "sim", 1, cpu=1.0) if seq % 10 == 0 else None,
                )
                data, _ = deserialize_object(serialize_object({ev.key(r, seq): body}))
                ranks[r].metadata["data"].update(data)
                sent[0] += 1
            t_next += 1 / hz
            stop.wait(max(0.0, t_next - time.monotonic()))

    mon = _sim_watch(n, store)
    pub = threading.Thread(target=publish)
    pub.start()
    backlog = []
    t_end = time.monotonic() + seconds
    try:
        while time.monotonic() < t_end:
            mon.poll(ranks)
            backlog.append(max(len(rk.metadata["data"]) for rk in ranks.values()))
            time.sleep(0.02)  # the supervisor's poll period (this is the loop under test)
    finally:
        stop.set()
        pub.join()
    mon.poll(ranks)
    mon.close("ok")
    dashboard = mon.find(Board).dashboard
    assert mon.collector.records == sent[0] >= n * hz * seconds * 0.5
    assert all(not rk.metadata["data"] for rk in ranks.values())
    assert statistics.median(backlog) <= 3, "batches pile up between polls"
    polls = sorted(mon.poll_seconds)
    assert polls[len(polls) // 2] < 0.05, f"median poll {polls[len(polls) // 2]:.3f} s"
    assert dashboard is not None and dashboard.updates >= seconds / CellOptions().refresh / 3
    assert len(store.metrics(mon.run_id)) == sent[0]
    assert store.get_run(mon.run_id)["status"] == "ok"


def test_the_watch_is_the_runs_observer_and_shows_its_phases(tmp_path):
    """Recovery reaches the dashboard at once and the store keeps it as events."""
    store = RunStore(tmp_path / "runs.sqlite")
    rk = SimpleNamespace(metadata={"data": {}, "stdout": ""}, outcome=None, pid=1)
    mon = _sim_watch(1, store)
    mon.on_phase(Phase.STARTING, Phase.RUNNING)
    where = ev.MeshCoords(("pp", "dp"), (2, 1), (1, 0))  # the rank's place in its mesh
    rk.metadata["data"][ev.key(1, 1)] = Batch(
        0,
        1,
        time.time(),
        [MetricRecord(time.time(), 0, 1.0, 8, 10, None)],
        _health(time.time(), mesh=where),
    )
    mon.poll({0: rk})
    board = mon.find(Board)
    assert board.dashboard is not None
    mon.on_event("failure", 0, "engine gone", {"cause": "died"})
    mon.on_phase(Phase.RUNNING, Phase.RECOVERING)
    assert board.dashboard.widget.head["status"] == "recovering"
    mon.on_event("restart", None, "restart 1: resuming", {"restarts": 1})
    mon.on_phase(Phase.RECOVERING, Phase.RUNNING)
    mon.poll({0: rk})
    assert board.dashboard.widget.head["status"] == "running"
    mon.on_phase(Phase.RUNNING, Phase.FINISHED)
    mon.close("ok")
    kinds = [(e["kind"], e["rank"], e["message"], e["data"]) for e in store.events(mon.run_id)]
    assert kinds == [
        ("failure", 0, "engine gone", {"cause": "died"}),
        ("phase", None, "running -> recovering", {"old": "running", "new": "recovering"}),
        ("restart", None, "restart 1: resuming", {"restarts": 1}),
        ("phase", None, "recovering -> running", {"old": "recovering", "new": "running"}),
        ("finished", None, kinds[-1][2], {}),
    ]
    assert store.get_run(mon.run_id)["status"] == "ok" and len(store.metrics(mon.run_id)) == 1
    assert [w["mesh"] for w in store.health(mon.run_id)] == ["pp 1/2 dp 0/1"]  # the sidebar's


# -- a real cluster ------------------------------------------------------------------------------


def test_a_batch_is_folded_at_once_its_pace_and_progress_once_per_batch():
    """Ten records a batch (20 reports a second, a batch every half second): every record's
    numbers reach the curves, the rest is folded once per batch."""
    col = Collector([0], CFG, clock=lambda: 1000.0)
    for b in range(3):
        recs = [
            MetricRecord(990.0 + 0.05 * i, i, 1.0, 4, None, {"acc": 0.5})
            for i in range(10 * b, 10 * b + 10)
        ]
        if b == 1:
            recs[3] = recs[3]._replace(loss=float("inf"))
        col.ingest(0, Batch(0, b + 1, recs[-1].time, recs))
    st = col.ranks[0]
    assert (col.records, st.reports, st.step, col.first_step) == (30, 30, 29, 0)
    assert st.step_time == pytest.approx(0.05)
    assert [s for _, s in st.progress] == [9, 19, 29]  # one point a batch
    assert st.nonfinite == "inf" and st.loss == 1.0
    events = [(e.kind, e.message) for e in col.take_news().events]
    assert events == [("nan", "loss is inf at step 13")]
    assert col.series.ranks["acc"][0].x == list(range(30))
    assert col.samples_per_s() == pytest.approx(120 / 1.45)
