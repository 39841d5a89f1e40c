/**
 * The run card's curve: one metric's mean over the whole run, as the server decimated it, small.
 *
 * A loss that falls from 2.3 to 1e-6 must not read as noise near zero: when the values span two
 * decades or more the y axis is logarithmic (and says so). The first and the last value are
 * written beside the plot, in a row of their own, so no label is ever drawn under the line.
 */
import React from 'react';

import { ILineData } from './api';
import { spansDecades } from './describe';
import { fmt, fmtInt } from './format';

const W = 200;
const H = 44;

export function Sparkline(props: {
  line: ILineData | null;
  name: string;
  /** What to say when there is no line (waiting, or a run that reported nothing). */
  empty: string;
}): JSX.Element {
  const line = props.line;
  if (!line || line.x.length < 2) {
    return (
      <div className="jp-nbdist-curve jp-nbdist-curveEmpty" data-testid="nbdist-curve-empty">
        {props.empty}
      </div>
    );
  }
  const { x, y } = line;
  const log = spansDecades(y);
  const ty = (v: number) => (log ? Math.log10(v) : v);
  const [x0, x1] = [x[0], x[x.length - 1]];
  let lo = Infinity;
  let hi = -Infinity;
  for (const v of y) {
    lo = Math.min(lo, ty(v));
    hi = Math.max(hi, ty(v));
  }
  const sx = (v: number) => (x1 === x0 ? W / 2 : ((v - x0) / (x1 - x0)) * W);
  const sy = (v: number) => (hi === lo ? H / 2 : H - 2 - ((ty(v) - lo) / (hi - lo)) * (H - 4));
  const points = x.map((v, i) => `${sx(v).toFixed(1)},${sy(y[i]).toFixed(1)}`).join(' ');
  const first = `step ${fmtInt(x0)}: ${fmt(y[0])}`;
  const last = `step ${fmtInt(x1)}: ${fmt(y[y.length - 1])}`;
  return (
    <div className="jp-nbdist-curve" data-log={String(log)} data-points={x.length}>
      <div className="jp-nbdist-curveHead">
        <span title={`${props.name}: the mean over ranks, over the whole run`}>
          {`${props.name} · whole run`}
        </span>
        {log && (
          <span className="jp-nbdist-curveTag" title="logarithmic y axis">
            log
          </span>
        )}
      </div>
      <svg
        className="jp-nbdist-curvePlot"
        viewBox={`0 0 ${W} ${H}`}
        preserveAspectRatio="none"
        role="img"
        aria-label={`${props.name} from ${first} to ${last}${log ? ', log scale' : ''}`}
      >
        <polyline points={points} fill="none" vectorEffect="non-scaling-stroke" />
      </svg>
      <div className="jp-nbdist-curveEnds">
        <span data-testid="nbdist-curve-first">{first}</span>
        <span data-testid="nbdist-curve-last">{last}</span>
      </div>
    </div>
  );
}
