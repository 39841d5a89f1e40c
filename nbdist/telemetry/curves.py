"""Curves of bounded size, whatever the length of the run: min/max decimation.

A run of a million steps must cost the kernel, the browser and the final picture what a run of
a thousand does. A ``Curve`` keeps at most ``limit`` points: when full, each group of four
consecutive points is replaced by its lowest and its highest (in x order), which halves the
curve and keeps its envelope, spikes included (plain thinning would drop a NaN-adjacent spike
half the time). The browser runs the same rule on what it is sent
(``extension/src/boards/series.ts``), so both sides agree on what a curve looks like.
"""

from __future__ import annotations


def minmax(xs: list[float], ys: list[float], groups: int) -> tuple[list[float], list[float]]:
    """``xs, ys`` cut into ``groups`` runs of consecutive points, each kept as its lowest and
    highest point in x order (a run of one point stays one point)."""
    n = len(xs)
    if n <= 2 * groups:
        return list(xs), list(ys)
    size = -(-n // groups)  # ceil
    out_x: list[float] = []
    out_y: list[float] = []
    for start in range(0, n, size):
        end = min(start + size, n)
        lo = hi = start
        for j in range(start, end):
            if ys[j] < ys[lo]:
                lo = j
            if ys[j] >= ys[hi]:  # ties: the later point, so a flat stretch keeps its end
                hi = j
        for k in sorted({lo, hi}):
            out_x.append(xs[k])
            out_y.append(ys[k])
    return out_x, out_y


class Curve:
    """(x, y) points in x order, at most ``limit`` of them, at one resolution along the run.

    Points arrive one at a time into a bucket of ``stride`` points; a full bucket is kept as its
    lowest and highest point. When the curve is full it is halved (pairs of buckets merged, by
    ``minmax``) and ``stride`` doubles, so old and new parts of a long run are drawn alike.
    """

    def __init__(self, limit: int = 2000):
        self.limit = max(8, limit)
        self.stride = 2  # a bucket keeps 2 of its points: the curve holds every point at first
        self._x: list[float] = []
        self._y: list[float] = []
        self._bucket: list[tuple[float, float]] = []  # (x, y) of the lowest and highest so far
        self._count = 0
        self._newest: tuple[float, float] | None = None

    def add(self, x: float, y: float) -> None:
        self._newest = (x, y)
        b = self._bucket
        if not b:
            b.extend(((x, y), (x, y)))
        else:
            if y < b[0][1]:
                b[0] = (x, y)
            if y >= b[1][1]:  # ties: the later point, as in minmax
                b[1] = (x, y)
        self._count += 1
        if self._count >= self.stride:
            self._close_bucket()

    def _close_bucket(self) -> None:
        lo, hi = self._bucket
        first, second = (lo, hi) if lo[0] <= hi[0] else (hi, lo)  # in x order
        self._x.append(first[0])
        self._y.append(first[1])
        if second != first:
            self._x.append(second[0])
            self._y.append(second[1])
        self._bucket.clear()
        self._count = 0
        if len(self._x) > self.limit:
            self._x, self._y = minmax(self._x, self._y, -(-len(self._x) // 4))  # pairs of buckets
            self.stride *= 2

    @property
    def x(self) -> list[float]:
        """Every kept x, the open bucket's included."""
        return self._x + [p[0] for p in sorted(set(self._bucket))]

    @property
    def y(self) -> list[float]:
        return self._y + [p[1] for p in sorted(set(self._bucket))]

    def __len__(self) -> int:
        return len(self._x) + len(set(self._bucket))

    def last(self) -> float | None:
        """The y of the latest point added, or None: the latest, even where decimation kept
        only its bucket's lowest and highest (the figure a header or a run's summary shows is
        the step's own, not a neighbour's)."""
        return self._newest[1] if self._newest else None

    def last_x(self) -> float | None:
        """The x of the latest point added, or None."""
        return self._newest[0] if self._newest else None


class Outbox:
    """Points added since the last ``take()``: what the next message to the browser carries.
    Bounded too: past ``limit`` waiting points it decimates them (a slow browser, a burst)."""

    def __init__(self, limit: int = 400):
        self.limit = limit
        self.x: list[float] = []
        self.y: list[float] = []

    def add(self, x: float, y: float) -> None:
        self.x.append(x)
        self.y.append(y)
        if len(self.x) > 2 * self.limit:
            self.x, self.y = minmax(self.x, self.y, self.limit // 2)

    def take(self) -> tuple[list[float], list[float]] | None:
        """The waiting points (decimated to ``limit``), or None; empties the box."""
        if not self.x:
            return None
        out = minmax(self.x, self.y, self.limit // 2)
        self.x, self.y = [], []
        return out


def decimated(curve: Curve, points: int) -> list:
    """``[xs, ys, stride]`` of ``curve``, cut to about ``points`` points, as a board's history
    sends it; ``stride``: raw points per bucket at that resolution, so the browser goes on
    adding points at the same one."""
    xs, ys = minmax(curve.x, curve.y, max(1, points // 2))
    factor = max(1, round(len(curve) / max(1, len(xs))))
    return [xs, ys, curve.stride * factor]
