/**
 * A chart per metric, in a grid. Each metric's chart appears when the metric is first reported;
 * a chip per metric shows or hides it (the first SHOWN_AT_FIRST are shown; a hidden metric has
 * no chart, so it costs nothing). Styled by style/boards/grid.css.
 */
import { IChartOptions, ILine, MetricChart } from '../chart';
import { el } from '../dom';

const SHOWN_AT_FIRST = 8;

export class ChartGrid {
  readonly node = el('div', 'nbdist-grid');
  /** metric -> its chart, while shown */
  readonly charts = new Map<string, MetricChart>();

  /** `options`: what every chart of the grid shares (sync, xLabel, height) */
  constructor(
    parent: HTMLElement,
    private readonly options: Omit<IChartOptions, 'title'>
  ) {
    this.node.append(this.chips, this.grid);
    parent.append(this.node);
  }

  /** `names`, in order; `linesOf(name)`: its chart's lines; `only`: the metrics that changed */
  draw(names: string[], linesOf: (name: string) => ILine[], only: Set<string> | null = null): void {
    this.redraw = () => this.draw(this.names, linesOf);
    if (names.join('\n') !== this.names.join('\n')) {
      for (const name of names.slice(this.names.length, SHOWN_AT_FIRST)) {
        this.shown.add(name);
      }
      this.names = [...names];
      this.drawChips();
    }
    this.node.style.display = names.length ? '' : 'none';
    for (const name of this.names) {
      let chart = this.charts.get(name);
      if (!this.shown.has(name)) {
        chart?.destroy();
        this.charts.delete(name);
        continue;
      }
      if (!chart) {
        chart = new MetricChart(this.grid, { title: name, ...this.options });
        chart.node.dataset.metric = name;
        this.charts.set(name, chart);
        only = null; // a new chart is drawn whole
      }
      if (only === null || only.has(name)) {
        chart.setLines(linesOf(name));
      }
    }
    // charts in the order of their metrics
    for (const name of this.names) {
      const chart = this.charts.get(name);
      if (chart) {
        this.grid.append(chart.node);
      }
    }
  }

  destroy(): void {
    for (const chart of this.charts.values()) {
      chart.destroy();
    }
    this.charts.clear();
  }

  private drawChips(): void {
    this.chips.textContent = '';
    if (this.names.length < 2) {
      return;
    }
    for (const name of this.names) {
      const chip = el('label', 'nbdist-chip');
      const box = el('input');
      box.type = 'checkbox';
      box.checked = this.shown.has(name);
      box.addEventListener('change', () => {
        if (box.checked) {
          this.shown.add(name);
        } else {
          this.shown.delete(name);
        }
        this.redraw();
      });
      chip.append(box, el('span', '', name));
      this.chips.append(chip);
    }
    const count = `${this.shown.size} of ${this.names.length} shown`;
    this.chips.append(el('span', 'nbdist-chip-count', count));
  }

  private readonly chips = el('div', 'nbdist-grid-chips');
  private readonly grid = el('div', 'nbdist-grid-charts');
  private names: string[] = [];
  private readonly shown = new Set<string>();
  private redraw: () => void = () => undefined;
}
