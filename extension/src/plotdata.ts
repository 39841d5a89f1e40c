/**
 * A chart's data: lines with x values of their own joined into the one table uPlot draws, and
 * the small lookups the readout and the log axis make. (`chart.ts` draws, `smoothing.ts`
 * smooths; this only computes, so it is read and tested apart.)
 */
import uPlot from 'uplot';

/** One line of a chart. `x` ascending; `y` null where there is no value. */
export interface ILine {
  label: string;
  x: ArrayLike<number>;
  y: ArrayLike<number | null>;
  /** A CSS colour, or 'strong' for the theme's main text colour (the mean). */
  colour: string;
  width?: number;
  alpha?: number;
  /** Dashes, as the canvas' setLineDash takes them (a stopped trial's line). */
  dash?: number[];
  /** A null of its own breaks the line (no line is drawn across it); else it is drawn across.
   * For a line alone on its chart: `join` puts nulls where other lines have points. */
  gaps?: boolean;
  /** The values before smoothing, point for point (set when `y` is smoothed): the readout
   * shows both, as TensorBoard does. */
  raw?: ArrayLike<number | null>;
  /** The label of the line this one's area is shaded down to (a band: the ranks' max to their
   * min), in this line's colour, faint. */
  band?: string;
}

/** What the readout says of one line at the x under the mouse: the line's own stored point
 * nearest that x (`x`: its x, which may differ from the cursor's on a decimated line), its
 * value as drawn (`y`: smoothed, when it is) and before smoothing (`raw`). */
export interface IReading {
  label: string;
  x: number;
  y: number;
  raw: number | null;
}

/** A span of x shaded on a chart, and named: the time a run spent recovering. */
export interface IBand {
  from: number;
  to: number;
  label: string;
  /** A CSS colour. */
  colour: string;
}

/**
 * Lines with x values of their own, as the table uPlot draws: the union of their x values, and
 * each line's values at those x (null where it has none: drawn across, `spanGaps`).
 */
export function join(lines: ILine[]): uPlot.AlignedData {
  const all: number[] = [];
  for (const l of lines) {
    for (let i = 0; i < l.x.length; i++) {
      all.push(l.x[i]);
    }
  }
  all.sort((a, b) => a - b);
  const xs: number[] = [];
  for (const x of all) {
    if (xs.length === 0 || xs[xs.length - 1] !== x) {
      xs.push(x);
    }
  }
  const columns = lines.map(l => {
    const ys: (number | null)[] = new Array(xs.length).fill(null);
    let j = 0;
    for (let i = 0; i < l.x.length; i++) {
      while (xs[j] < l.x[i]) {
        j++;
      }
      const v = l.y[i];
      ys[j] = v !== null && Number.isFinite(v) ? v : null;
    }
    return ys;
  });
  return [xs, ...columns];
}

/**
 * A line's points with none across the bands: those inside a band dropped, a null at each band's
 * start and end (drawn with `gaps`, the line stops at the band and starts again after it; the x
 * axis reaches the band's end even before a point does). `bands` in x order.
 */
export function broken(
  line: { x: ArrayLike<number>; y: ArrayLike<number | null> },
  bands: IBand[]
): { x: number[]; y: (number | null)[] } {
  const x: number[] = [];
  const y: (number | null)[] = [];
  let b = 0;
  for (let i = 0; i <= line.x.length; i++) {
    const at = i < line.x.length ? line.x[i] : Infinity;
    while (b < bands.length && bands[b].from <= at) {
      x.push(bands[b].from, bands[b].to);
      y.push(null, null);
      b++;
    }
    const inside = bands.some(band => band.from <= at && at <= band.to);
    if (i < line.x.length && !inside) {
      x.push(at);
      y.push(line.y[i]);
    }
  }
  return { x, y };
}

/**
 * Each line's reading at `x`: its own stored point nearest `x` (ties: the earlier), never a value
 * of another line's point nor one at another index of the joined table. A line with no value
 * has no reading. Decimated lines do not share every x: a line whose nearest point is not at
 * `x` says its own x (the readout names that step).
 */
export function readings(lines: ILine[], x: number): IReading[] {
  const out: IReading[] = [];
  for (const l of lines) {
    const i = nearest(l.x, l.y, x);
    if (i >= 0) {
      const raw = l.raw ? l.raw[i] : l.y[i];
      out.push({
        label: l.label,
        x: l.x[i],
        y: l.y[i] as number,
        raw: raw !== null && raw !== undefined && Number.isFinite(raw) ? raw : null
      });
    }
  }
  return out;
}

/** The index of the point of `x` (ascending) nearest `at` whose value is finite, or -1. */
function nearest(x: ArrayLike<number>, y: ArrayLike<number | null>, at: number): number {
  let lo = 0;
  let hi = x.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (x[mid] < at) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  const ok = (i: number) => {
    const v = y[i];
    return v !== null && v !== undefined && Number.isFinite(v);
  };
  let left = lo - 1;
  while (left >= 0 && !ok(left)) {
    left--;
  }
  let right = lo;
  while (right < x.length && !ok(right)) {
    right++;
  }
  if (right >= x.length) {
    return left;
  }
  if (left < 0) {
    return right;
  }
  return at - x[left] <= x[right] - at ? left : right;
}

/** The last finite values of a line (for choosing its format). */
export function finiteTail(y: ArrayLike<number | null>): number[] {
  const out: number[] = [];
  for (let i = Math.max(0, y.length - 200); i < y.length; i++) {
    const v = y[i];
    if (v !== null && Number.isFinite(v)) {
      out.push(v);
    }
  }
  return out;
}

export function isDecade(v: number): boolean {
  if (v === 0) {
    return true;
  }
  const e = Math.log10(Math.abs(v));
  return Math.abs(e - Math.round(e)) < 1e-9;
}
