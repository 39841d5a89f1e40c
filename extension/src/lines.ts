/**
 * The server's curves as the lines a `MetricChart` draws: a metric's ranks and their mean (the
 * run view), or one run's mean each (the compare view), smoothed alike (smoothing.ts, as the
 * boards do).
 */
import { ILineData, IMetricCurves, IRun } from './api';
import { ILine } from './chart';
import { runTitle } from './describe';
import { PALETTE, rankLines, smoothed } from './smoothing';

/** One metric's lines: each rank's (while there are few) and their mean, in the theme's
 * strongest colour. */
export function metricLines(m: IMetricCurves, smoothing: number): ILine[] {
  return rankLines(m.ranks, m.mean, smoothing);
}

/** One line per run: its mean of the metric, in the run's colour (its place in `runs`). */
export function runLines(runs: IRun[], means: Map<number, ILineData>, smoothing: number): ILine[] {
  const out: ILine[] = [];
  runs.forEach((r, i) => {
    const data = means.get(r.id);
    if (data) {
      out.push(
        smoothed(runTitle(r), data, smoothing, { colour: runColour(i), width: 1.75, alpha: 0.95 })
      );
    }
  });
  return out;
}

/** The colour of the i-th run compared. */
export function runColour(i: number): string {
  return PALETTE[i % PALETTE.length];
}

/** A line with each y mapped (bytes to MiB, a share to %). */
export function scaled(data: ILineData, by: number): ILineData {
  return by === 1 ? data : { x: data.x, y: data.y.map(v => v * by) };
}
