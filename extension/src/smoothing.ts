/**
 * TensorBoard's smoothing, as every chart of nbdist applies it: an exponential moving average
 * whose weight a slider sets (0 to 0.99), and the lines it smooths: a metric's ranks and their
 * mean (the run's board, the sidebar's run view), one line per trial (the sweep's board) or per
 * run (the sidebar's comparison). The boards (boards/) and the sidebar (lines.ts, chartbox.tsx)
 * all take it from here, so one weight smooths alike wherever a curve is drawn.
 */
import { el } from './dom';
import { ILine } from './plotdata';

/** The weight's range and step, as every smoothing slider offers it. */
export const SMOOTHING = { min: 0, max: 0.99, step: 0.01 };

/** Colours of ranks, trials and runs, in order: matplotlib's tab10 (the pictures' C0..C9). */
export const PALETTE = [
  '#1f77b4',
  '#ff7f0e',
  '#2ca02c',
  '#d62728',
  '#9467bd',
  '#8c564b',
  '#e377c2',
  '#7f7f7f',
  '#bcbd22',
  '#17becf'
];

/** Past this many ranks a chart draws only their mean (the tables have every rank). */
export const RANK_LINES = 16;

/** Exponential moving average, as TensorBoard's smoothing slider (debiased at the start). */
export function smooth(y: ArrayLike<number | null>, weight: number): (number | null)[] {
  const out: (number | null)[] = [];
  let last = 0;
  let n = 0;
  for (let i = 0; i < y.length; i++) {
    const v = y[i];
    if (v === null || !weight) {
      out.push(v);
      continue;
    }
    last = last * weight + (1 - weight) * v;
    n++;
    out.push(last / (1 - Math.pow(weight, n)));
  }
  return out;
}

/** A curve's points, x ascending. */
export interface IPoints {
  x: ArrayLike<number>;
  y: ArrayLike<number | null>;
}

/** One rank's points. */
export interface IRankPoints extends IPoints {
  rank: number;
}

/** How a line is drawn, besides its label and points. */
export type LineStyle = Omit<ILine, 'label' | 'x' | 'y'>;

/** `points` as a chart's line, smoothed by `weight` (its raw values kept beside, for the
 * readout, when they are smoothed). */
export function smoothed(label: string, points: IPoints, weight: number, style: LineStyle): ILine {
  const line: ILine = { label, x: points.x, y: smooth(points.y, weight), ...style };
  if (weight) {
    line.raw = points.y;
  }
  return line;
}

/**
 * One metric's lines: each rank's (while there are few, in the palette's colours) and their
 * mean in the theme's strongest colour, unless one rank's line says it all.
 */
export function rankLines(ranks: IRankPoints[], mean: IPoints, weight: number): ILine[] {
  const out =
    ranks.length > RANK_LINES
      ? []
      : ranks.map((points, i) =>
          smoothed(`rank ${points.rank}`, points, weight, {
            colour: PALETTE[i % PALETTE.length],
            width: 1,
            alpha: 0.75
          })
        );
  if (ranks.length !== 1 || !out.length) {
    out.push(smoothed('mean', mean, weight, { colour: 'strong', width: 2, alpha: 0.9 }));
  }
  return out;
}

/** The band's colour: the ranks' lowest to highest value, shaded. */
const BAND = '#7f7f7f';

/**
 * One metric's lines over many ranks: the band of their values (their highest, shaded down to
 * their lowest), their mean in the theme's strongest colour, and each outlier rank's own line
 * (in the palette's colours, the farthest first), all smoothed alike.
 */
export function spreadLines(
  mean: IPoints,
  lo: IPoints,
  hi: IPoints,
  outliers: IRankPoints[],
  weight: number
): ILine[] {
  return [
    smoothed('max', hi, weight, { colour: BAND, width: 1, alpha: 0.6, band: 'min' }),
    smoothed('min', lo, weight, { colour: BAND, width: 1, alpha: 0.6 }),
    smoothed('mean', mean, weight, { colour: 'strong', width: 2, alpha: 0.9 }),
    ...outliers.map((points, i) =>
      smoothed(`rank ${points.rank}`, points, weight, {
        colour: PALETTE[(3 + i) % PALETTE.length],
        width: 1.25,
        alpha: 0.9
      })
    )
  ];
}

/**
 * The boards' smoothing slider (DOM; the sidebar's is React, chartbox.tsx): "smoothing", the
 * range and the weight shown; `onChange` at each move.
 */
export function smoothingSlider(
  cls: string,
  weight: number,
  onChange: (weight: number) => void
): HTMLLabelElement {
  const label = el('label', cls);
  const slider = el('input');
  slider.type = 'range';
  slider.min = String(SMOOTHING.min);
  slider.max = String(SMOOTHING.max);
  slider.step = String(SMOOTHING.step);
  slider.value = String(weight);
  const shown = el('span', '', slider.value);
  label.append(el('span', '', 'smoothing '), slider, shown);
  slider.addEventListener('input', () => {
    shown.textContent = slider.value;
    onChange(Number(slider.value));
  });
  return label;
}
