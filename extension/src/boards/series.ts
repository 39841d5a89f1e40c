/**
 * A curve as a board keeps it in the browser: at most MAX_POINTS points, at one resolution along
 * the run, by the kernel's own rule (nbdist/telemetry/curves.py, which tests/unit/
 * test_dashboard_js.py holds this against): points go into a bucket of `stride` points, a full
 * bucket keeps its lowest and highest point, and when the series is full it is halved (pairs of
 * buckets merged) and `stride` doubles. Spikes survive; the start of a long run is drawn at the
 * same resolution as its end, and a run of a million steps costs the browser what a run of a
 * thousand does.
 */

/** Points kept per series. */
export const MAX_POINTS = 2000;

/**
 * A curve's points as the kernel sends them: `[xs, ys]` in a delta (new points), `[xs, ys,
 * stride]` in a history (everything so far, decimated: `telemetry.curves.decimated`).
 */
export type SentPoints = [xs: number[], ys: (number | null)[], stride?: number];

type Point = [x: number, y: number];

export class Series {
  x: number[] = [];
  y: number[] = [];
  stride: number;

  constructor(stride = 2) {
    this.stride = Math.max(2, stride);
  }

  /** A series of these points, already decimated at `stride` (a history's). */
  static of(xs: number[], ys: (number | null)[], stride?: number): Series {
    const s = new Series(stride);
    for (let i = 0; i < xs.length; i++) {
      const y = ys[i];
      if (y !== null && Number.isFinite(y)) {
        s.x.push(xs[i]);
        s.y.push(y);
      }
    }
    return s;
  }

  push(x: number, y: number | null): void {
    if (y === null || !Number.isFinite(y)) {
      return;
    }
    if (this._lo === null || this._hi === null) {
      this._lo = [x, y];
      this._hi = [x, y];
    } else {
      if (y < this._lo[1]) {
        this._lo = [x, y];
      }
      if (y >= this._hi[1]) {
        this._hi = [x, y]; // ties: the later point
      }
    }
    if (++this._count >= this.stride) {
      this._close(this._lo, this._hi);
    }
  }

  extend(xs: number[], ys: (number | null)[]): void {
    for (let i = 0; i < xs.length; i++) {
      this.push(xs[i], ys[i]);
    }
  }

  /** What to draw: the kept points and the open bucket's. */
  view(): { x: number[]; y: number[] } {
    if (this._lo === null || this._hi === null) {
      return { x: this.x, y: this.y };
    }
    const pts = inOrder(this._lo, this._hi);
    return {
      x: this.x.concat(pts.map(p => p[0])),
      y: this.y.concat(pts.map(p => p[1]))
    };
  }

  get length(): number {
    return this.x.length + (this._lo === null ? 0 : 1);
  }

  /** The full bucket's lowest and highest point kept, in x order. */
  private _close(lo: Point, hi: Point): void {
    for (const [x, y] of inOrder(lo, hi)) {
      this.x.push(x);
      this.y.push(y);
    }
    this._lo = this._hi = null;
    this._count = 0;
    if (this.x.length > MAX_POINTS) {
      this._halve();
    }
  }

  /** Each group of four points (two buckets) keeps its lowest and highest, in x order. */
  private _halve(): void {
    const x: number[] = [];
    const y: number[] = [];
    for (let i = 0; i < this.x.length; i += 4) {
      let lo = i;
      let hi = i;
      for (let j = i; j < Math.min(i + 4, this.x.length); j++) {
        if (this.y[j] < this.y[lo]) {
          lo = j;
        }
        if (this.y[j] >= this.y[hi]) {
          hi = j;
        }
      }
      for (const k of lo === hi ? [lo] : lo < hi ? [lo, hi] : [hi, lo]) {
        x.push(this.x[k]);
        y.push(this.y[k]);
      }
    }
    this.x = x;
    this.y = y;
    this.stride *= 2;
  }

  /** The open bucket's lowest and highest points ([x, y]), null while it is empty. */
  private _lo: Point | null = null;
  private _hi: Point | null = null;
  private _count = 0;
}

/** A bucket's lowest and highest point, in x order. */
function inOrder(lo: Point, hi: Point): Point[] {
  return lo[0] <= hi[0] ? [lo, hi] : [hi, lo];
}

/** A message's points into a series: a history's replace it, a delta's are appended. */
export function into(series: Series | undefined, points: SentPoints, whole: boolean): Series {
  const [xs, ys, stride] = points;
  if (whole) {
    return Series.of(xs, ys, stride);
  }
  const out = series ?? new Series();
  out.extend(xs, ys);
  return out;
}

/** Points sent by rank or trial (its number as text) into `curves`; returns how many came. */
export function mergeAll(
  curves: Map<number, Series>,
  sent: Record<string, SentPoints>,
  whole: boolean
): number {
  let count = 0;
  for (const [key, points] of Object.entries(sent)) {
    const k = Number(key);
    curves.set(k, into(curves.get(k), points, whole));
    count += points[0].length;
  }
  return count;
}
