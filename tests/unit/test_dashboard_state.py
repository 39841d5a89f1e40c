"""The dashboard's kernel half: bounded curves, deltas that carry only what is new, and text from
engines that stays text. The widget is real (anywidget); only the front end is absent."""

from __future__ import annotations

import json
import math
import random
import re
import time
from types import SimpleNamespace

import pytest
from front_end import Clock

from nbdist.config import CellOptions, TelemetryConfig
from nbdist.notebook.board.collector import Collector
from nbdist.notebook.board.dashboard import Dashboard
from nbdist.notebook.run.observers.assembly import assemble
from nbdist.notebook.run.observers.base import Phase
from nbdist.notebook.run.observers.dashboard import Board
from nbdist.protocol import CellOutcome
from nbdist.telemetry import curves
from nbdist.telemetry import events as ev
from nbdist.telemetry.curves import Curve, Outbox, minmax
from nbdist.telemetry.events import Batch, HealthSample, MeshCoords, MetricRecord, RunEvent
from nbdist.telemetry.store import RunStore


@pytest.fixture
def shown(no_front_end):
    """A dashboard with its widget, whose messages to the browser are kept for inspection."""
    col = Collector([0, 1], TelemetryConfig(), total=None, clock=Clock(1000.0))
    board = Dashboard("run 1")
    board.show(col)
    sent = []
    board.widget.send = lambda content, buffers=None: sent.append(content)
    return col, board, sent, no_front_end.handle


def _feed(col, rank, steps, t0=1000.0, loss=lambda s: 1.0 / (s + 1), extra=None):
    recs = [MetricRecord(t0 + s * 0.01, s, loss(s), 8, None, extra and extra(s)) for s in steps]
    col.ingest(rank, Batch(rank, 1, t0, recs, HealthSample(t0, f"h{rank}", 100 + rank, cpu=50.0)))


def test_a_curve_keeps_its_envelope_within_its_limit():
    rng = random.Random(0)
    c = Curve(2000)
    ys = [rng.gauss(0, 1) for _ in range(200_000)]
    ys[123_456] = 50.0  # a spike that plain thinning would lose half the time
    ys[7] = -50.0
    for i, y in enumerate(ys):
        c.add(i, y)
    assert 1000 <= len(c) <= 2000
    assert max(c.y) == 50.0 and min(c.y) == -50.0
    assert c.x == sorted(c.x)
    early = sum(1 for x in c.x if x < 20_000)  # the first tenth of the run
    assert 0.05 * len(c) < early < 0.15 * len(c), "old and new parts at one resolution"
    xs, ys2 = minmax(list(range(10)), [float(i) for i in range(10)], 2)
    assert (xs, ys2) == ([0, 4, 5, 9], [0.0, 4.0, 5.0, 9.0])
    box = Outbox(limit=100)
    for i in range(10_000):
        box.add(i, math.sin(i))
    xs, ys3 = box.take()
    assert len(xs) <= 100 and box.take() is None


def test_updates_send_only_what_is_new(shown):
    col, board, sent, _ = shown
    assert board.widget.history["seq"] == 1 and board.widget.history["rows"] == []
    _feed(col, 0, range(10))
    _feed(col, 1, range(10), extra=lambda s: {"acc": s / 10} if s % 5 == 4 else None)
    col.update_states()
    col.settle_mean()
    board.update(col, [], "running")
    first = sent[-1]
    assert first["kind"] == "delta" and first["seq"] == 2
    loss = first["metrics"]["loss"]
    assert loss["ranks"]["0"][0] == list(range(10)) and len(loss["ranks"]["1"][1]) == 10
    assert loss["mean"][0] == list(range(10)) and loss["mean"][1][0] == pytest.approx(1.0)
    # a metric at a cadence of its own: its own curve, on the same step axis
    assert first["metrics"]["acc"] == {
        "ranks": {"1": [[4, 9], [0.4, 0.9]]},
        "mean": [[4, 9], [0.4, 0.9]],
    }
    assert [r["rank"] for r in first["rows"]] == [0, 1]
    assert board.widget.head["status"] == "running" and board.widget.head["steps"] == 10
    assert [r["steps"] for r in first["rows"]] == [10, 10]  # the head's count, per rank
    n = len(sent)
    board.update(col, [], "running")  # nothing happened: nothing is sent
    assert sent[n:] == []
    _feed(col, 1, [10])
    events = [RunEvent(time.time(), "checkpoint", 0, "checkpoint of step 9 written", None)]
    board.update(col, events, "running")
    last = sent[-1]
    assert last["metrics"] == {"loss": {"ranks": {"1": [[10], [pytest.approx(1 / 11)]]}}}
    # step 10's mean waits for rank 0
    assert [e["kind"] for e in last["events"]] == ["checkpoint"]
    assert last["seq"] > first["seq"]


def test_a_million_steps_cost_what_a_thousand_do(shown, monkeypatch):
    """Simulated publishers, as a long run delivers them (batches of 1000 records), with twenty
    metrics: every curve, every message and the late views' history stay bounded, and so does
    the work of an update once the curves are full (the points it decimates: counted, not
    timed, so a busy machine cannot fail it)."""
    col, board, sent, _ = shown
    steps_per_batch = 1000
    work = [0]
    decimate = curves.minmax

    def counted(xs, ys, groups):
        work[0] += len(xs)
        return decimate(xs, ys, groups)

    monkeypatch.setattr(curves, "minmax", counted)

    def extra(s):  # nineteen more metrics, every 100th step
        return {f"m{i}": i + 1 / (s + 1) for i in range(19)} if s % 100 == 0 else None

    def run(upto, start=0):
        work[0] = 0
        for s0 in range(start, upto, steps_per_batch):
            for r in (0, 1):  # rank 1 reports every 10th step: a million records in all
                steps = range(s0, s0 + steps_per_batch, 1 if r == 0 else 10)
                _feed(col, r, steps, loss=lambda s: 1 / math.sqrt(s + 1), extra=extra)
            col.settle_mean()
            col.clock.now += 0.25  # the board's pace: a history refresh every 20 updates
            board.update(col, [], "running")
        return work[0] / ((upto - start) / steps_per_batch)

    run(200_000)  # by now every curve is full (the twenty metrics' too)
    early = run(240_000, start=200_000)
    run(960_000, start=240_000)
    late = run(1_000_000, start=960_000)
    assert col.records == 1_100_000 and col.done() == 999_991
    series = col.series
    assert len(series.names) == 20
    assert all(len(c) <= 2000 for ranks in series.ranks.values() for c in ranks.values())
    assert all(len(c) <= 2000 for c in series.mean.values())
    assert max(len(json.dumps(m)) for m in sent) < 60_000, "a message grew with the run"
    assert board.sent_bytes == 0  # counted only when a benchmark asks (dashboard.COUNT_BYTES)
    board.update(col, [], "finished", final=True)
    assert len(json.dumps(board.widget.history)) < 1_000_000
    assert late <= 1.2 * early, f"an update decimates {late:.0f} points late, {early:.0f} early"


def test_text_from_engines_stays_text_and_bad_numbers_never_break_anything(shown):
    col, board, sent, handle = shown
    board.title = "run 2 (<b>bold</b> $\\alpha_$)"
    nasty = ["nan", "inf", "-inf", "not a number"]
    recs = [
        MetricRecord(1000.0, 0, 1.0, 8, None, None),
        MetricRecord(1000.1, 1, float("nan"), 8, None, None),
        MetricRecord(1000.2, 2, float("inf"), 8, None, None),
    ]
    col.ingest(0, Batch(0, 1, 1000.0, recs, HealthSample(1000.0, "<i>host</i>", 1, cpu=1.0)))
    col.ranks[0].log.extend(["<script>alert(1)</script>", "$\\alpha_$ and <b>"])
    events = [RunEvent(1000.0, "warning", 0, "<img src=x onerror=alert(1)> $x_$", None)]
    col.update_states()
    board.update(col, events, "running")
    svg = board.finish(col, events, "failed", ended=col.clock())
    assert svg.startswith("<svg") and "<script" not in svg and "<img" not in svg  # text, escaped
    assert "&lt;img src=x onerror=alert(1)&gt;" in svg and "&lt;i&gt;host&lt;/i&gt;" in svg
    assert "image/svg+xml" in handle.updates[-1] and "text/plain" in handle.updates[-1]
    for msg in [*sent, board.widget.history, board.widget.head]:
        json.dumps(msg, allow_nan=False)  # what the browser can parse: no NaN, no Infinity
    history = board.widget.history
    assert history["rows"][0]["loss"] in nasty and history["rows"][0]["host"] == "<i>host</i>"
    assert history["logs"]["0"][0] == "<script>alert(1)</script>"  # as text, for textContent
    assert history["events"][-1]["message"].startswith("<img")


def test_each_ranks_place_in_the_mesh_is_a_column_per_dimension(shown):
    """Ranks of a dp × tp mesh: a dp and a tp column (their coordinate "i/n"), no pp column,
    in the live table and in the picture kept for renderers without widgets."""
    col, board, sent, _ = shown
    for rank in (0, 1):
        where = MeshCoords(("dp", "tp"), (1, 2), (0, rank))
        col.ingest(rank, Batch(rank, 1, 1000.0, [], HealthSample(1000.0, "h", 1, mesh=where)))
    col.update_states()
    board.update(col, [], "running")
    assert [(r["pp"], r["dp"], r["tp"]) for r in sent[-1]["rows"]] == [
        (None, "0/1", "0/2"),
        (None, "0/1", "1/2"),
    ]
    svg = board.finish(col, [], "ok", ended=col.clock())
    headings = re.findall(r'font-weight="bold">([^<]*)</text>', svg)
    assert "dp" in headings and "tp" in headings and "pp" not in headings
    assert headings.index("dp") < headings.index("tp")  # outermost first


def test_the_data_wait_is_a_column_when_some_rank_has_one(shown):
    """A rank's share of its steps waiting for data: "data" in its row (%, None without a
    loader), and a "data %" column in the picture only when some rank has a value."""
    col, board, sent, _ = shown
    for rank, share in ((0, 0.125), (1, None)):
        sample = HealthSample(1000.0, "h", 1, data_share=share)
        col.ingest(rank, Batch(rank, 1, 1000.0, [], sample))
    col.update_states()
    board.update(col, [], "running")
    assert [r["data"] for r in sent[-1]["rows"]] == [12.5, None]
    svg = board.finish(col, [], "ok", ended=col.clock())
    assert "data %" in re.findall(r'font-weight="bold">([^<]*)</text>', svg)
    col.ingest(0, Batch(0, 2, 1001.0, [], HealthSample(1001.0, "h", 1)))
    col.update_states()
    assert "data %" not in board.finish(col, [], "ok", ended=col.clock())


# -- a recovery, told as one story ---------------------------------------------------------------
def _attempt(pids: dict[int, int]) -> dict:
    """One attempt's feeds, as the supervisor hands them to the watch (a new one each attempt)."""
    return {r: SimpleNamespace(metadata={"data": {}, "stdout": ""}, outcome=None, pid=pid)
            for r, pid in pids.items()}  # fmt: skip


def _send(feed, rank: int, t: float, steps: range, events=()) -> None:
    """What ``rank``'s engine sends at ``t``: a record per step, 8 samples each, and events."""
    recs = [MetricRecord(t, s, 1.0 / (s + 1), 8, 60, None) for s in steps]
    seq = round(t * 1000)
    batch = Batch(rank, seq, t, recs, HealthSample(t, "h", feed.pid), events=list(events))
    feed.metadata["data"][ev.key(feed.pid, seq)] = batch


def test_after_a_recovery_the_board_tells_one_story(no_front_end, tmp_path):
    """Rank 1's engine dies mid-cell, recovery puts a fresh one in its place and the cell runs
    again to the end. The board then says one thing: every rank done (not rank 1 dead and its
    peer stopped), rank 1 on its new pid with its history kept; the events that tell the failure
    and the recovery kept in view, however many ordinary ones came after; the time spent
    recovering a span of its own, with no samples/s inside it, a band in the picture."""
    w = assemble("nbdist.report(...)", CellOptions(), [0, 1], store_at=RunStore(tmp_path / "r"),
                 cfg=TelemetryConfig(silent_after=30.0))  # fmt: skip
    clock = w.collector.clock = Clock(w.collector.started)
    w.on_phase(Phase.STARTING, Phase.RUNNING)
    first = _attempt({0: 100, 1: 101})
    for t in range(1, 6):  # five seconds of training, two steps a second on each rank
        clock.now = w.collector.started + t
        for r in (0, 1):
            _send(first[r], r, clock.now, range(2 * t - 2, 2 * t))
        w.poll(first)
    died = clock.now
    first[1].outcome = CellOutcome("died", died, summary="engine process killed by SIGKILL")
    first[0].outcome = CellOutcome("error", died, summary="RuntimeError: Connection closed by peer")
    w.poll(first)
    w.on_event("failure", 1, "engine process killed by SIGKILL", {"cause": "died"})
    clock.now += 1
    w.on_phase(Phase.RUNNING, Phase.RECOVERING)
    board = w.find(Board).dashboard
    assert board.head["status"] == "recovering" and board.head["rate"] is None
    assert [(r["state"], r["pid"]) for r in board.rows] == [("stopped", 100), ("dead", 101)]
    clock.now += 8  # eight seconds to get a fresh engine and its state back
    w.on_event("restart", None, "restart 1: resuming", {"restarts": 1})
    w.on_phase(Phase.RECOVERING, Phase.RUNNING)
    again = _attempt({0: 100, 1: 201})
    noise = [ev.EventRecord(clock.now, "checkpoint", "written", None)] * 60
    for t in range(1, 6):  # from the checkpoint of step 8 to the end, step 17
        clock.now += 1
        for r in (0, 1):
            _send(again[r], r, clock.now, range(6 + 2 * t, 8 + 2 * t), noise if t == 3 else ())
        w.poll(again)
        w.tick()
    live = {r["rank"]: r for r in board.rows}
    assert [live[r]["state"] for r in (0, 1)] == ["ok", "ok"]  # running again, both
    assert (live[1]["pid"], live[1]["replaced"], live[0]["replaced"]) == (201, [101], [])
    for feed in again.values():
        feed.outcome = CellOutcome("ok", clock.now)
    w.poll(again)
    w.on_phase(Phase.RUNNING, Phase.FINISHED)
    w.close("ok")

    rows = board.widget.history["rows"]
    assert [(r["state"], r["pid"], r["replaced"], r["steps"]) for r in rows] == [
        ("done", 100, [], 18),
        ("done", 201, [101], 18),
    ]
    assert w.collector.ranks[1].samples == 8 * (10 + 10)  # both attempts' samples: its history
    assert len(w.collector.series.ranks["loss"][1]) > 0
    kinds = [(e["kind"], e["rank"]) for e in board.widget.history["events"]]
    story = [("died", 1), ("failure", 1), ("phase", None), ("restart", None), ("phase", None),
             ("replaced", 1)]  # fmt: skip
    assert [k for k in kinds if k[0] != "checkpoint"] == [*story, ("finished", None)]
    # every ordinary event kept (up to 500: the board's events box scrolls)
    assert kinds.count(("checkpoint", 0)) + kinds.count(("checkpoint", 1)) == 2 * 60
    replaced = next(e for e in w.events if e.kind == "replaced")
    assert replaced.message == "a fresh engine (pid 201) in place of pid 101"
    # the time spent recovering: from the phase's start to its end, no samples/s inside it
    [(start, end)] = board.recovering
    assert (start, end) == (pytest.approx(died + 1 - w.collector.started), start + 8)
    assert board.widget.history["recovering"] == [[start, end]]
    assert not [x for x in board.rate.x if start <= x <= end]
    assert [x for x in board.rate.x if x < start] and [x for x in board.rate.x if x > end]
    svg = no_front_end.handle.updates[-1]["image/svg+xml"]
    assert ">recovering</text>" in svg and ">201 \u21bb</text>" in svg
    assert ">replaced rank 1: a fresh engine (pid 201) in place of pid 101</text>" in svg
    assert {h["rank"]: h["state"] for h in RunStore(tmp_path / "r").health(w.run_id)} == {
        0: "done",
        1: "done",
    }


def test_a_new_attempt_is_judged_from_its_own_start(no_front_end):
    """A rank of the next attempt is neither silent nor past the progress deadline for the time
    the recovery took: its quiet time counts from the attempt's start, and its samples/s from the
    attempt's first record."""
    clock = Clock(1000.0)
    col = Collector([0], TelemetryConfig(silent_after=5.0), clock=clock)
    first = _attempt({0: 100})
    _send(first[0], 0, 1000.0, range(10))
    col.poll(first)
    clock.now = 1030.0  # thirty seconds of recovery
    again = _attempt({0: 200})
    col.poll(again)
    col.update_states()
    st = col.ranks[0]
    assert (st.state, st.since, st.last_record, st.pid, st.replaced) == (
        "ok",
        1030.0,
        None,
        200,
        [100],
    )
    assert col.samples_per_s() is None  # nothing of this attempt yet
    _send(again[0], 0, 1031.0, range(8, 10))
    _send(again[0], 0, 1032.0, range(10, 12))
    clock.now = 1032.0
    col.poll(again)
    col.update_states()
    assert st.state == "ok" and st.step == 11 and st.samples == 8 * 14
    assert col.samples_per_s() == pytest.approx(32 / 1.0)  # this attempt's, not across the gap
    clock.now = 1040.0
    col.update_states()
    assert st.state == "silent"  # eight seconds with no news, in this attempt


def test_the_head_and_the_table_say_which_step_their_loss_is_of(shown):
    """The head's loss is the mean over ranks at the latest step all ranks passed, as the
    observers were told it (the run store's), with that step; each row's loss is the rank's
    latest, with its step; an end event does not say its kind twice."""
    col, board, sent, _ = shown
    board.means["loss"] = (8, 0.123)  # as the Board observer keeps them (on_mean)
    _feed(col, 0, range(10))
    _feed(col, 1, range(9))
    board.update(col, [], "running")
    assert (board.head["mean_loss"], board.head["mean_step"]) == (0.123, 8)
    assert [(r["rank"], r["loss"], r["loss_step"]) for r in board.rows] == [
        (0, pytest.approx(1 / 10), 9),
        (1, pytest.approx(1 / 9), 8),
    ]
    end = RunEvent(0.0, "failed", None, "failed after 1.1 s: rank 1: KeyError: 'b'", None)
    board.update(col, [end], "failed")
    assert sent[-1]["events"][0]["message"] == "after 1.1 s: rank 1: KeyError: 'b'"


def test_a_front_end_that_lost_a_message_gets_the_whole_board_again(shown):
    """A view that saw a gap in the sequence (or no news for a while) asks for the whole board:
    the kernel answers (between cells) with a history of a new sequence number, as of the latest
    update; at the end the widget carries the picture too, for a view that could not draw."""
    from nbdist.notebook.board.widget import _heard

    col, board, sent, _ = shown
    _feed(col, 0, range(10))
    _feed(col, 1, range(10))
    col.settle_mean()
    board.update(col, [], "running")
    seq = board.seq
    _heard(board.widget, {"kind": "resend", "seq": 1, "why": "message 2 was lost"}, [])
    history = board.widget.history
    assert board.widget.resends == 1 and history["seq"] == seq + 1 > seq
    assert history["metrics"]["loss"]["ranks"]["1"][0] == list(range(10))
    svg = board.finish(col, [], "ok", 1001.0)
    assert board.widget.picture == svg and svg.startswith("<svg")


def _ranks_report(w, clock, feeds, steps, loss) -> None:
    """Every rank reports ``steps`` (a second apart), the watch polled and ticked after each."""
    for s in steps:
        clock.now += 1
        for r, feed in feeds.items():
            rec = MetricRecord(clock.now, s, loss(r, s), 8, None, {"acc": 0.5})
            seq = round(clock.now * 1000)
            feed.metadata["data"][ev.key(feed.pid, seq)] = Batch(
                r, seq, clock.now, [rec], HealthSample(clock.now, "h", feed.pid)
            )
        w.poll(feeds)
        w.tick()


def test_many_ranks_are_sent_as_a_band_and_their_outliers(no_front_end, tmp_path):
    """64 ranks: the board is sent each metric's mean, the band of the ranks' values about it
    and the outlier ranks' curves alone (rank 40's loss stands far above the others'), never a
    curve per rank; what a message carries does not grow with the ranks' records."""
    n = 64
    store, cfg = RunStore(tmp_path / "r"), TelemetryConfig(silent_after=60.0)
    w = assemble("nbdist.report(...)", CellOptions(), list(range(n)), store_at=store, cfg=cfg)
    clock = w.collector.clock = Clock(w.collector.started)
    w.on_phase(Phase.STARTING, Phase.RUNNING)
    feeds = _attempt({r: 1000 + r for r in range(n)})
    loss = lambda r, s: 1.0 / (s + 1) + 0.001 * r + (2.0 if r == 40 else 0.0)  # noqa: E731
    _ranks_report(w, clock, feeds, range(20), loss)
    board = w.find(Board).dashboard
    history = board.widget.history["metrics"]
    assert history["loss"]["outliers"] == [40] and list(history["loss"]["ranks"]) == ["40"]
    assert history["acc"]["outliers"] == [] and history["acc"]["ranks"] == {}
    lo, hi = history["loss"]["lo"], history["loss"]["hi"]
    assert lo[1][0] == pytest.approx(1.0) and hi[1][0] == pytest.approx(3.04)
    sent = []
    board.widget.send = lambda content, buffers=None: sent.append(content)
    _ranks_report(w, clock, feeds, range(20, 24), loss)
    deltas = [d for d in sent if "metrics" in d]
    assert deltas and all(set(d["metrics"]["loss"].get("ranks", {})) <= {"40"} for d in deltas)
    assert sum(len(d["metrics"]["loss"].get("hi", [[]])[0]) for d in deltas) >= 3
    assert max(len(json.dumps(d)) for d in sent) < 4000  # 64 ranks' records: a few KB


def test_a_decimated_curves_last_value_is_the_latest_steps_own():
    # Past its limit a curve keeps each bucket's lowest and highest: the latest point added may
    # be neither, and the header, the store's summary and the readout must all show that one.
    curve = Curve(limit=8)
    for step in range(1, 2006):
        curve.add(step, float(step % 10))  # the last, 5.0, neither its bucket's lowest nor highest
    assert (curve.last_x(), curve.last()) == (2005, 5.0)
    assert len(curve.x) <= 8 + 2
