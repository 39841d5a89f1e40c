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
