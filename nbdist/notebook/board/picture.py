"""The dashboard as one SVG picture, made when a cell ends, for renderers without widgets.

A saved notebook, GitHub, nbviewer, or a front end without the widget show this picture of the
finished board: the loss (each rank and their mean; past a few ranks, as the live board draws it,
their mean, the band of their lowest to highest value and the outlier ranks' own lines, named:
``Band``), samples/s (the time spent recovering a
band, with no line across it), up to six more metrics, the workers and the last events. It is
written as text here, with no plotting library: the kernel spends a few milliseconds on it, where
drawing it with matplotlib took a third of a second of its CPU (and its import, once, a second
more) at the end of every cell. Text from engines (metric names, hosts, messages) is escaped: it
shows as text, never as markup.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape

from ...telemetry.format import MISSING, fmt
from ...telemetry.spread import MANY_RANKS

WIDTH = 760
#: Metrics other than loss drawn (the live board has them all).
_OTHER_METRICS = 6
_MAX_POINTS = 400  # per line: a picture, not the data
_MAX_RANK_LINES = 16
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
            "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")  # fmt: skip
_STATE_COLOURS = {"ok": "#2e7d32", "slow": "#ef6c00", "silent": "#9e9d24", "dead": "#c62828",
                  "failed": "#c62828", "stopped": "#757575", "done": "#1976d2"}  # fmt: skip
#: The workers table: (row key, heading, format); the data wait's, a mesh's and a pipeline's
#: columns only when some rank has a value.
_COLUMNS = (
    ("rank", "rank", "d"), ("host", "host", ""), ("pid", "pid", "pid"), ("state", "state", ""),
    ("steps", "steps", ","),
    ("loss", "loss", ".4g"), ("step_ms", "step ms", ".0f"), ("cpu", "cpu %", ".0f"),
    ("rss_mb", "rss MB", ".0f"), ("gpu_util", "gpu %", ".0f"), ("gpu_mb", "gpu MB", ".0f"),
    ("comm", "comm %", ".0f"), ("data", "data %", ".0f"), ("pp", "pp", ""), ("dp", "dp", ""),
    ("tp", "tp", ""), ("stage", "stage", ""), ("idle", "idle %", ".0f"),
)  # fmt: skip
_OPTIONAL = ("data", "pp", "dp", "tp", "stage", "idle")
_TABLE_ROWS = 16
_ROW_H = 17
_BAND = "#ef6c00"  # the time spent recovering, as the board's "recovering" badge
_SPREAD = "#7f7f7f"  # the band of the ranks' values about their mean, as the live board's
_OUTLIER_COLOURS = 3  # outliers take the palette from its fourth colour on, as the live board

Curve = tuple[Sequence[float], Sequence[float]]  # (x, y)


@dataclass(frozen=True)
class Band:
    """Past a few ranks, what a metric's chart draws beside the mean: the ranks' lowest (``lo``)
    and highest (``hi``) value at each step, shaded between, of ``ranks`` ranks; its
    ``outliers`` (the farthest first) are the only ranks whose lines it is given."""

    lo: Curve
    hi: Curve
    ranks: int
    outliers: tuple[int, ...] = ()

    def title(self, name: str, short: bool = False) -> str:
        """What the chart draws, as the live board's title says it (``short``: fewer words,
        the outliers still named, for a small chart)."""
        named = f", outliers {', '.join(map(str, self.outliers))}" if self.outliers else ""
        if short:
            return f"{name}: mean, min\u2013max of {self.ranks}{named}"
        return f"{name}: mean, min\u2013max band of {self.ranks} ranks{named}"


def dashboard_svg(
    title: str,
    summary: str,
    metrics: dict[str, tuple[list[tuple[int, list, list]], Curve]],
    rate: Curve,
    rows: list[dict],
    events: list[tuple[str, int | None, str]],
    recovering: Sequence[tuple[float, float]] = (),
    bands: Mapping[str, Band] | None = None,
) -> str:
    """The finished board as an SVG document. ``metrics``: ``{name: ([(rank, steps, values)],
    (steps, mean))}``; ``rate``: samples/s over seconds; ``rows``: the workers table's rows;
    ``events``: (kind, rank, message), those shown; ``recovering``: the spans spent recovering,
    in seconds (a band each on the samples/s chart); ``bands``: past a few ranks, each metric's
    band and outliers (its ranks in ``metrics`` are then the outliers' alone)."""
    bands = bands or {}
    parts: list[str] = [
        _text(12, 22, title, size=15, bold=True),
        _text(12, 42, summary, size=12, fill="#444"),
    ]
    ranks, mean = metrics.get("loss", ([], ([], [])))
    title, lines, fill = _drawn("loss", ranks, mean, bands.get("loss"))
    parts.append(_chart(12, 56, 470, 210, title, lines, "step", legend=True, fill=fill))
    rate_line = [(*_broken(rate, [a for a, _ in recovering]), "#1565c0", 1.6, 1.0)]
    parts.append(
        _chart(500, 56, 248, 210, "samples/s", rate_line, "s", from_zero=True, bands=recovering)
    )
    y = 280
    others = [n for n in metrics if n != "loss"][:_OTHER_METRICS]
    for i, name in enumerate(others):
        col, row = i % 3, i // 3
        title, lines, fill = _drawn(name, *metrics[name], bands.get(name), short=True)
        parts.append(_chart(12 + col * 248, y + row * 150, 240, 140, title, lines, fill=fill))
    y += 150 * -(-len(others) // 3) + 8
    table, y = _table(rows, y)
    parts.append(table)
    for kind, rank, message in events:
        who = f" rank {rank}" if rank is not None else ""
        parts.append(_text(12, y + 14, f"{kind}{who}: {message}"[:150], size=11, fill="#333"))
        y += 17
    height = y + 12
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif">'
        f'<rect width="{WIDTH}" height="{height}" fill="#fff"/>' + "".join(parts) + "</svg>"
    )


def _drawn(
    name: str, ranks: list, mean: Curve, band: Band | None, short: bool = False
) -> tuple[str, list, Any]:
    """A metric's chart: its title (``short``: a small chart's), its lines, and what is shaded
    (the band's edges, or None). Past a few ranks (``band``): the band, the mean and the
    outliers' lines, named; else each rank's line (while few) and their mean."""
    if band is None:
        many = len(ranks) > _MAX_RANK_LINES
        return (f"{name}: mean of {len(ranks)} ranks" if many else name), _lines(ranks, mean), None
    lines: list = [(*band.hi, _SPREAD, 1.0, 0.6, "min\u2013max")]
    lines.append((*band.lo, _SPREAD, 1.0, 0.6, None))
    if mean[0]:
        lines.append((*mean, "#000", 2.0, 1.0, "mean"))
    curves = {rank: (xs, ys) for rank, xs, ys in ranks}
    for i, rank in enumerate(r for r in band.outliers if r in curves):
        colour = _PALETTE[(_OUTLIER_COLOURS + i) % len(_PALETTE)]
        lines.append((*curves[rank], colour, 1.25, 0.9, rank))
    return band.title(name, short), lines, (band.lo, band.hi)


def _lines(ranks: list[tuple[int, list, list]], mean: Curve) -> list:
    """(x, y, colour, width, opacity) per line: each rank (faint when many), then the mean."""
    many = len(ranks) > MANY_RANKS  # ranks drawn faint and without a legend
    lines = []
    if len(ranks) <= _MAX_RANK_LINES:
        for i, (rank, xs, ys) in enumerate(ranks):
            colour = _PALETTE[i % len(_PALETTE)]
            lines.append((xs, ys, colour, 1.0, 0.35 if many else 0.8, None if many else rank))
    if mean[0] and (len(ranks) > 1 or not lines):
        lines.append((*mean, "#000", 2.0, 1.0, "mean"))
    return lines


def _broken(line: Curve, at: Sequence[float]) -> Curve:
    """``line`` with a gap at each of ``at`` (a point with no value: no line drawn across)."""
    pts = sorted([*zip(line[0], line[1], strict=False), *((x, math.nan) for x in at)])
    return [x for x, _ in pts], [y for _, y in pts]


def _chart(x0: float, y0: float, w: float, h: float, title: str, lines: list, xlabel: str = "",
           legend: bool = False, from_zero: bool = False,
           bands: Sequence[tuple[float, float]] = (),
           fill: tuple[Curve, Curve] | None = None) -> str:  # fmt: skip
    """One chart: its title, a frame with ticks on both axes, and its lines (gaps where a
    value is not finite); ``from_zero``: the y axis starts at 0 (a rate); ``bands``: spans of
    x spent recovering, shaded and labelled; ``fill``: the (lower, upper) edges of the ranks'
    band, shaded between (its ranks' lines, the outliers', named at their ends when there is
    no ``legend``)."""
    left, top, bottom = x0 + 46, y0 + 20, y0 + h - 22
    right = x0 + w - 6
    out = [_title(x0 + 2, y0 + 13, w - 4, title)]
    finite = [
        (x, y) for xs, ys, *_ in lines for x, y in zip(xs, ys, strict=False) if _ok(x) and _ok(y)
    ]
    out.append(
        f'<rect x="{left}" y="{top}" width="{right - left:.1f}" height="{bottom - top:.1f}" '
        'fill="none" stroke="#bbb"/>'
    )
    if not finite:
        out.append(_text(left + 8, top + 20, "no values", size=11, fill="#888"))
        return "".join(out)
    xlo, xhi = _span([p[0] for p in finite] + [x for band in bands for x in band])
    ylo, yhi = _span([p[1] for p in finite] + ([0.0] if from_zero else []))

    def px(x: float) -> float:
        return left + (x - xlo) / (xhi - xlo) * (right - left)

    def py(y: float) -> float:
        return bottom - (y - ylo) / (yhi - ylo) * (bottom - top)

    for a, b in bands:
        out.append(f'<rect x="{px(a):.1f}" y="{top}" width="{px(b) - px(a):.1f}" '
                   f'height="{bottom - top:.1f}" fill="{_BAND}" fill-opacity="0.2"/>')  # fmt: skip
        out.append(_text(px(a) + 3, bottom - 4, "recovering", size=10, fill=_BAND))
    for t in _ticks(ylo, yhi):
        out.append(f'<line x1="{left}" x2="{right:.1f}" y1="{py(t):.1f}" y2="{py(t):.1f}" '
                   'stroke="#eee"/>')  # fmt: skip
        out.append(_text(left - 4, py(t) + 4, fmt(t), size=10, fill="#555", anchor="end"))
    for t in _ticks(xlo, xhi):
        out.append(_text(px(t), bottom + 13, fmt(t), size=10, fill="#555", anchor="middle"))
    if xlabel:
        out.append(_text(right, bottom + 13, xlabel, size=10, fill="#888", anchor="end"))
    if fill is not None:
        out.append(_shade(fill, px, py))
    named = []
    for xs, ys, colour, width, opacity, *label in lines:
        for seg in _segments(xs, ys):
            if len(seg) == 1:  # a point between gaps: a dot, not an invisible line
                (x, y), r = seg[0], width + 1
                out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="{r}" fill="{colour}"/>')
                continue
            pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in seg)
            out.append(
                f'<polyline points="{pts}" fill="none" stroke="{colour}" '
                f'stroke-width="{width}" stroke-opacity="{opacity}"/>'
            )
        if label and label[0] is not None:
            named.append((label[0], colour))
        segs = _segments(xs, ys) if fill and not legend and label and _ok(label[0]) else []
        if segs:  # an outlier among many ranks, on a chart without a legend: named at its end
            x, y = segs[-1][-1]
            out.append(_text(px(x) - 3, py(y) - 4, f"rank {label[0]}", 10, fill=colour,
                             anchor="end"))  # fmt: skip
    if legend and named:
        for i, (label, colour) in enumerate(named):
            ly = top + 12 + 13 * i
            out.append(f'<line x1="{right - 64}" x2="{right - 50}" y1="{ly - 4}" y2="{ly - 4}" '
                       f'stroke="{colour}" stroke-width="2"/>')  # fmt: skip
            name = label if isinstance(label, str) else f"rank {label}"
            out.append(_text(right - 46, ly, name, size=10, fill="#333"))
    return "".join(out)


def _title(x: float, y: float, w: float, title: str) -> str:
    """A chart's title in ``w`` pixels: its metric's name in bold, what is drawn of it (after
    ": ") beside in grey, cut short with an ellipsis where it would not fit."""
    name, _, said = title.partition(": ")
    out = _text(x, y, name, size=12, bold=True)
    if said:
        room = int((w - 7.5 * (len(name) + 2)) / 5.6)  # about 5.6 px a character at 10 px
        said = said if len(said) <= room else said[: max(0, room - 1)] + "\u2026"
        out += _text(x + 7.5 * (len(name) + 1), y, said, size=10, fill="#555")
    return out


def _shade(edges: tuple[Curve, Curve], px, py) -> str:
    """The band between its lower and upper edges, shaded (a polygon: along the upper edge,
    back along the lower; a step where either is not finite left out)."""
    lo, hi = edges
    upper = [p for seg in _segments(*hi) for p in seg]
    lower = [p for seg in _segments(*lo) for p in seg][::-1]
    if len(upper) < 2 or len(lower) < 2:
        return ""
    pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in upper + lower)
    return f'<polygon points="{pts}" fill="{_SPREAD}" fill-opacity="0.22" stroke="none"/>'


def _table(rows: list[dict], y: float) -> tuple[str, float]:
    """The workers table from ``y`` down; the markup and the y below it."""
    shown = rows[:_TABLE_ROWS]
    if not shown:
        return "", y
    cols = [c for c in _COLUMNS if c[0] not in _OPTIONAL or any(r.get(c[0]) is not None
                                                                for r in shown)]  # fmt: skip
    width = (WIDTH - 24) / len(cols)
    state_at = [key for key, *_ in cols].index("state")  # its cell: a box in the state's colour
    out = []
    for j, (_, heading, _) in enumerate(cols):
        out.append(_text(14 + j * width, y + 13, heading, size=11, bold=True))
    for i, row in enumerate(shown, start=1):
        top = y + i * _ROW_H
        colour = _STATE_COLOURS.get(str(row.get("state")), "#555")
        out.append(f'<rect x="{12 + state_at * width:.1f}" y="{top + 2}" width="{width - 4:.1f}" '
                   f'height="{_ROW_H - 3}" fill="{colour}"/>')  # fmt: skip
        for j, (key, _, spec) in enumerate(cols):
            fill = "#fff" if key == "state" else "#222"
            text = _cell(row.get(key), spec, row)
            out.append(_text(14 + j * width, top + 13, text, 11, fill=fill))
    y += (len(shown) + 1) * _ROW_H + 4
    if len(rows) > len(shown):
        out.append(_text(12, y + 12, f"... and {len(rows) - len(shown)} more ranks", 11))
        y += 17
    return "".join(out), y


def _cell(value: object, spec: str, row: dict | None = None) -> str:
    if value is None:
        return MISSING
    if spec == "pid":  # a rank's fresh engine, after a recovery: marked
        return f"{value} \u21bb" if row and row.get("replaced") else str(value)
    if isinstance(value, str) or not spec:
        return str(value)[:24]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return fmt(value) if spec == ".4g" else format(value, spec)


def _text(x: float, y: float, text: str, size: int = 12, *, bold: bool = False,
          fill: str = "#111", anchor: str = "start") -> str:  # fmt: skip
    weight = ' font-weight="bold"' if bold else ""
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" fill="{fill}" '
        f'text-anchor="{anchor}"{weight}>{escape(str(text))}</text>'
    )


def _ok(v: object) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def _span(values: list[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if hi == lo:
        pad = abs(lo) * 0.05 or 1.0
        return lo - pad, hi + pad
    return lo, hi


def _ticks(lo: float, hi: float, most: int = 5) -> list[float]:
    """Round values between ``lo`` and ``hi``, at most ``most`` (1, 2 or 5 times a power of
    ten apart)."""
    raw = (hi - lo) / most
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(most + 1) if first + i * step <= hi + step * 1e-9]


def _segments(xs: Sequence, ys: Sequence) -> list[list[tuple[float, float]]]:
    """The line's runs of finite points, thinned to about ``_MAX_POINTS`` (the last kept)."""
    n = min(len(xs), len(ys))
    stride = max(1, math.ceil(n / _MAX_POINTS))
    keep = [i for i in range(0, n, stride)] + ([n - 1] if n and (n - 1) % stride else [])
    runs, run = [], []
    for i in keep:
        if _ok(xs[i]) and _ok(ys[i]):
            run.append((xs[i], ys[i]))
        elif run:
            runs.append(run)
            run = []
    if run:
        runs.append(run)
    return runs
