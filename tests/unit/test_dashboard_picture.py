"""The finished board's picture (the SVG shown where no front end draws the widget: nbclient,
GitHub, a notebook reopened without its kernel) draws what the live board draws: past a few
ranks each metric's mean, the band of the ranks' values about it and the outlier ranks' own
lines, named; a few ranks, a line each and their mean. Fed through a real run's watch."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from front_end import Clock

from nbdist.config import CellOptions, TelemetryConfig
from nbdist.notebook.run.observers.assembly import assemble
from nbdist.notebook.run.observers.base import Phase
from nbdist.telemetry import events as ev
from nbdist.telemetry.events import Batch, HealthSample, MetricRecord
from nbdist.telemetry.store import RunStore

OUTLIER = "#d62728"  # the first outlier's colour (the palette's fourth, as the live board's)


def _picture(n: int, tmp_path, no_front_end, loss) -> str:
    """The picture at the end of a run of ``n`` ranks reporting 20 steps of ``loss(rank, step)``
    and a steady ``acc`` (rank 7's far below the others' past 8 ranks)."""
    cfg = TelemetryConfig(silent_after=60.0)
    w = assemble("nbdist.report(...)", CellOptions(), list(range(n)),
                 store_at=RunStore(tmp_path / "r"), cfg=cfg)  # fmt: skip
    clock = w.collector.clock = Clock(w.collector.started)
    w.on_phase(Phase.STARTING, Phase.RUNNING)
    feeds = {r: SimpleNamespace(metadata={"data": {}, "stdout": ""}, outcome=None, pid=1000 + r)
             for r in range(n)}  # fmt: skip
    for s in range(20):
        clock.now += 1
        for r, feed in feeds.items():
            acc = 0.5 + 0.001 * r - (0.3 if r == 7 and n > 8 else 0.0)
            rec = MetricRecord(clock.now, s, loss(r, s), 8, None, {"acc": acc})
            seq = round(clock.now * 1000)
            feed.metadata["data"][ev.key(feed.pid, seq)] = Batch(
                r, seq, clock.now, [rec], HealthSample(clock.now, "h", feed.pid)
            )
        w.poll(feeds)
        w.tick()
    w.close("ok")
    return no_front_end.handle.updates[-1]["image/svg+xml"]


def _metric_lines(svg: str) -> list[str]:
    """The metrics' lines (not samples/s's)."""
    return [p for p in re.findall(r"<polyline [^>]*/>", svg) if 'stroke="#1565c0"' not in p]


def _points(markup: str) -> set[tuple[str, str]]:
    return {tuple(p.split(",")) for p in re.search(r'points="([^"]*)"', markup)[1].split()}


def test_past_a_few_ranks_the_picture_draws_the_band_and_names_the_outliers(tmp_path, no_front_end):
    n = 64
    svg = _picture(n, tmp_path, no_front_end,
                   lambda r, s: 1.0 / (s + 1) + 0.001 * r + (2.0 if r == 40 else 0.0))  # fmt: skip
    texts = re.findall(r"<text [^>]*>([^<]*)</text>", svg)
    # each chart's title says what it draws, as the live board's does
    assert "mean, min\u2013max band of 64 ranks, outliers 40" in texts
    assert "mean, min\u2013max of 64, outliers 7" in texts  # acc's, a small chart: fewer words
    # the band shaded on both charts; never a line per rank
    bands = re.findall(r"<polygon [^>]*/>", svg)
    assert len(bands) == 2 and all('fill="#7f7f7f"' in b for b in bands)
    lines = _metric_lines(svg)
    assert len(lines) == 8, lines  # loss and acc: max, min, mean, the outlier
    outlier = [line for line in lines if f'stroke="{OUTLIER}"' in line]
    assert len(outlier) == 2
    # rank 40 is every step's highest: the band's upper edge is its line
    top = _points(outlier[0])
    assert len(top & _points(bands[0])) >= len(top) - 1
    # named in the loss chart's legend; on the small acc chart, at its line's end
    assert texts.count("rank 40") == 1 and "min\u2013max" in texts and "mean" in texts
    assert texts.count("rank 7") == 1


def test_a_few_ranks_are_a_line_each_and_their_mean(tmp_path, no_front_end):
    svg = _picture(4, tmp_path, no_front_end, lambda r, s: (1 + r) / (s + 1))
    texts = re.findall(r"<text [^>]*>([^<]*)</text>", svg)
    assert "<polygon" not in svg and not any("band" in t for t in texts)
    assert [t for t in texts if t.startswith("rank ")] == [f"rank {r}" for r in range(4)]
    assert len(_metric_lines(svg)) == 2 * 5  # loss and acc: 4 ranks and the mean


@pytest.mark.parametrize("ranks", [9, 64])
def test_the_picture_of_many_ranks_stays_small(tmp_path, no_front_end, ranks):
    svg = _picture(ranks, tmp_path, no_front_end, lambda r, s: 1.0 / (s + 1) + 0.01 * r)
    # the band's edges and the mean, for loss and acc; and rank 7's acc, its outlier
    assert len(_metric_lines(svg)) == 7
