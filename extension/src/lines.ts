/**
 * The server's curves as the lines a `MetricChart` draws: a metric's ranks and their mean (the
 * run view), or one run's mean each (the compare view), smoothed alike.
 */
import { ILineData, IMetricCurves, IRun } from './api';
import { ILine, smooth } from './chart';
import { PALETTE, runTitle } from './describe';

/** Past this many ranks a chart draws only their mean (the board does the same). */
export const RANK_LINES = 16;

function line(
  label: string,
  data: ILineData,
  colour: string,
  smoothing: number,
  width = 1,
  alpha = 1
): ILine {
  return { label, x: data.x, y: smooth(data.y, smoothing), colour, width, alpha };
}

/** One metric's lines: each rank's (while there are few) and their mean, in the theme's
 * strongest colour. */
export function metricLines(m: IMetricCurves, smoothing: number): ILine[] {
  const out =
    m.ranks.length > RANK_LINES
      ? []
      : m.ranks.map((r, i) =>
          line(`rank ${r.rank}`, r, PALETTE[i % PALETTE.length], smoothing, 1, 0.75)
        );
  if (m.ranks.length !== 1 || !out.length) {
    out.push(line('mean', m.mean, 'strong', smoothing, 2, 0.9));
  }
  return out;
}

/** One line per run: its mean of the metric, in the run's colour (its place in `runs`). */
export function runLines(runs: IRun[], means: Map<number, ILineData>, smoothing: number): ILine[] {
  const out: ILine[] = [];
  runs.forEach((r, i) => {
    const data = means.get(r.id);
    if (data) {
      out.push(line(runTitle(r), data, runColour(i), smoothing, 1.75, 0.95));
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
