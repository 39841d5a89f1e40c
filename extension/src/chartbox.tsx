/**
 * A `MetricChart` (chart.ts, uPlot) in a React view: made when the box mounts, given new lines
 * when they change, destroyed when it unmounts. Key it by what it charts: its options (axis,
 * height) are read once, its title follows (it says what is drawn: the outliers change). Its y axis is logarithmic while its lines span decades (a loss falling
 * from 2.3 to 1e-6, as a live run's comes to), until the chart's `log` toggle is pressed: from
 * then on the person decides.
 */
import React from 'react';

import { retitle } from './boards/charts';
import { IChartOptions, ILine, MetricChart } from './chart';
import { spansDecades } from './describe';
import { SMOOTHING } from './smoothing';

export function ChartBox(props: {
  /** What it charts (a metric's name, a health measure): the box's data-metric. */
  name: string;
  options: IChartOptions;
  lines: ILine[];
  /** Never start logarithmic (measures that start at zero: CPU, memory). */
  linear?: boolean;
}): JSX.Element {
  const box = React.useRef<HTMLDivElement>(null);
  const chart = React.useRef<MetricChart | null>(null);
  const chosen = React.useRef(false); // the person pressed the log toggle
  React.useEffect(() => {
    const node = box.current;
    chart.current = new MetricChart(node, props.options);
    const onClick = (e: MouseEvent) => {
      if ((e.target as Element).closest('.nbdist-chart-log')) {
        chosen.current = true;
      }
    };
    node?.addEventListener('click', onClick, true);
    return () => {
      node?.removeEventListener('click', onClick, true);
      chart.current?.destroy();
      chart.current = null;
    };
  }, []);
  React.useEffect(() => {
    const c = chart.current;
    if (c === null) {
      return;
    }
    c.setLines(props.lines);
    if (!chosen.current && !props.linear) {
      const log = spansDecades(props.lines.flatMap(l => Array.from(l.y)));
      if (log !== c.log) {
        c.setLog(log);
      }
    }
  }, [props.lines]);
  React.useEffect(() => {
    if (chart.current) {
      retitle(chart.current, props.options.title);
    }
  }, [props.options.title]);
  return <div ref={box} className="jp-nbdist-chartBox" data-metric={props.name} />;
}

/** TensorBoard's smoothing slider (an exponential moving average's weight: smoothing.ts, whose
 * DOM slider the boards show). */
export function SmoothingSlider(props: {
  value: number;
  onChange: (weight: number) => void;
}): JSX.Element {
  return (
    <label className="jp-nbdist-smoothing">
      smoothing
      <input
        type="range"
        min={SMOOTHING.min}
        max={SMOOTHING.max}
        step={SMOOTHING.step}
        value={props.value}
        aria-label="smoothing"
        onChange={e => props.onChange(Number(e.target.value))}
      />
      <span>{props.value.toFixed(2)}</span>
    </label>
  );
}
