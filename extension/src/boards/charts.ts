/**
 * A board's charts and their smoothing: the slider, loss beside samples/s on top, every other
 * metric in a grid below. A view makes one; what it draws in them is its own.
 */
import { IChartOptions, MetricChart } from '../chart';
import { el } from '../dom';
import { smoothingSlider } from '../smoothing';
import { ChartGrid } from './grid';

export interface IBoardChartsOptions {
  /** the slider's class, and its weight at first */
  slider: string;
  smoothing: number;
  /** the class of the box of the charts on top */
  box: string;
  /** what every chart of the grid shares (their sync key, height) */
  grid: Omit<IChartOptions, 'title'>;
}

export class BoardCharts {
  /** The slider's weight. */
  smoothing: number;
  readonly slider: HTMLLabelElement;
  /** The charts on top: loss (its data-metric "loss") beside samples/s (from zero). */
  readonly top: HTMLElement;
  readonly loss: MetricChart;
  readonly rate: MetricChart;
  readonly grid: ChartGrid;

  /** `redraw`: draw every chart again (the weight moved). */
  constructor(
    options: IBoardChartsOptions,
    loss: IChartOptions,
    rate: IChartOptions,
    redraw: () => void
  ) {
    this.smoothing = options.smoothing;
    this.slider = smoothingSlider(options.slider, options.smoothing, weight => {
      this.smoothing = weight;
      redraw();
    });
    this.top = el('div', options.box);
    this.loss = new MetricChart(this.top, loss);
    this.loss.node.dataset.metric = 'loss';
    this.rate = new MetricChart(this.top, { zeroBased: true, ...rate });
    this.grid = new ChartGrid(el('div'), options.grid);
  }

  /** Every chart drawn now. */
  all(): MetricChart[] {
    return [this.loss, this.rate, ...this.grid.charts.values()];
  }

  destroy(): void {
    this.loss.destroy();
    this.rate.destroy();
    this.grid.destroy();
  }
}

/** Set `chart`'s title to `title` (in full on hover too, where the chart is narrow). */
export function retitle(chart: MetricChart, title: string): void {
  const span = chart.node.querySelector<HTMLElement>('.nbdist-chart-title');
  if (span && span.textContent !== title) {
    span.textContent = title;
    span.title = title;
  }
}

/**
 * What a metric's chart draws, said in its title: each rank's line and their mean (a few
 * ranks), the mean alone (past RANK_LINES, with no band), or past the kernel's MANY_RANKS the
 * mean, the band of the ranks' lowest to highest value and the outlier ranks named:
 * "loss: mean, min–max band of 64 ranks, outliers 3, 40".
 */
export function titleOf(
  name: string,
  ranks: number,
  drawn: 'ranks' | 'mean' | 'band',
  outliers: number[] = []
): string {
  if (drawn === 'band') {
    const named = outliers.length ? `, outliers ${outliers.join(', ')}` : '';
    return `${name}: mean, min–max band of ${ranks} ranks${named}`;
  }
  if (drawn === 'mean') {
    return `${name}: mean of ${ranks} ranks`;
  }
  return ranks > 1 ? `${name} per rank, and their mean` : name;
}
