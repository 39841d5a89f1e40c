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

/** The value at `idx` of a column, or the nearest one within a few points (decimated lines
 * do not share every x). */
export function near(column: ArrayLike<number | null | undefined>, idx: number): number | null {
  for (let d = 0; d < 64; d++) {
    for (const i of d ? [idx - d, idx + d] : [idx]) {
      const v = i >= 0 && i < column.length ? column[i] : null;
      if (v !== null && v !== undefined) {
        return v;
      }
    }
  }
  return null;
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
