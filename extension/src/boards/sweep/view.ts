/**
 * A view of the sweep's board: the head (title, status, trials by state, time), the best trial,
 * the smoothing slider, loss and samples/s per trial, every other metric in a grid (a curve per
 * trial, coloured by trial, dashed when it did not end well), the legend and the trials table.
 * A trial under the pointer, in the legend or the table, is brought forward in every chart. The
 * data attributes on the root (status, best, points, curves, charts, trials) are what the
 * browser tests read.
 */
import { el } from '../../dom';
import { fmt, fmtDuration } from '../../format';
import { PALETTE, smoothed } from '../../smoothing';
import { BoardCharts } from '../charts';
import { Series } from '../series';
import { IChanged } from '../store';
import { follow, syncKey } from '../view';
import { RATE, STATES, TrialState } from './messages';
import { SweepStore } from './store';
import { TrialTable } from './table';

const LEGEND_MAX = 24; // trials named in the legend; the rest are counted
// matplotlib's tab10, as the final picture's "C0".."C9": a trial's colour is PALETTE[id % 10]
const colourOf = (trial: number) => PALETTE[((trial % 10) + 10) % 10];
const DASHES: Partial<Record<TrialState, number[]>> = { stopped: [6, 4], failed: [2, 3] };

export function render(root: HTMLElement, store: SweepStore): () => void {
  root.classList.add('nbs-board');
  const sync = syncKey('nbs'); // this view's step axes
  let highlight: number | null = null; // the trial under the pointer, in the legend or the table

  const head = el('div', 'nbs-head');
  const title = el('span', 'nbs-title');
  const badge = el('span', 'nbs-badge');
  const counts = el('span', 'nbs-counts');
  const stats = el('span', 'nbs-stats');
  head.append(title, badge, counts, stats);
  const bestLine = el('div', 'nbs-best-line');
  const shared = { sync, height: 200, empty: 'waiting for points …' };
  const charts = new BoardCharts(
    { slider: 'nbs-controls', smoothing: 0, box: 'nbs-charts', grid: { sync, height: 130 } },
    { title: 'loss per trial', ...shared },
    { title: 'samples / s per trial', ...shared },
    () => drawCharts({ all: true })
  );
  const { loss: lossChart, rate: rateChart, grid } = charts;
  const legend = el('div', 'nbs-legend');
  const table = new TrialTable();
  root.append(head, bestLine, charts.slider, charts.top, grid.node, legend, table.node);

  const stateOf = (t: number) => store.rows.get(t)?.state || 'running';
  const labelOf = (t: number) => `#${t} ${store.rows.get(t)?.label || ''}`;

  // A metric's lines: one per trial, coloured by trial, dashed when it did not end well.
  function linesOf(name: string) {
    const curves = store.metrics.get(name) ?? new Map<number, Series>();
    const weight = name === RATE ? 0 : charts.smoothing;
    return [...curves.entries()]
      .sort(([a], [b]) => a - b)
      .map(([t, series]) =>
        smoothed(labelOf(t), series.view(), weight, {
          colour: colourOf(t),
          width: 1.2,
          alpha: stateOf(t) === 'failed' ? 0.5 : 0.9,
          dash: DASHES[stateOf(t)]
        })
      );
  }

  function drawCharts(changed: IChanged) {
    const names = changed.all || changed.rows ? null : (changed.metrics ?? null);
    if (!names || names.has('loss')) {
      lossChart.setLines(linesOf('loss'));
    }
    if (!names || names.has(RATE)) {
      rateChart.setLines(linesOf(RATE));
    }
    grid.draw(store.others(), linesOf, names);
    focus();
    const loss = store.metrics.get('loss');
    root.dataset.curves = String(loss ? loss.size : 0);
    root.dataset.charts = String(2 + grid.charts.size);
  }

  function focus() {
    const label = highlight === null ? null : labelOf(highlight);
    for (const chart of charts.all()) {
      chart.focus(label);
    }
  }

  function drawLegend() {
    legend.textContent = '';
    const ids = store.trials();
    for (const t of ids.slice(0, LEGEND_MAX)) {
      const key = el('span', `nbs-key nbs-key-${stateOf(t)}`);
      key.style.setProperty('--nbs-key', colourOf(t));
      key.append(el('span', 'nbs-swatch'), el('span', '', labelOf(t)));
      hover(key, t);
      legend.append(key);
    }
    if (ids.length > LEGEND_MAX) {
      legend.append(el('span', 'nbs-more', `+${ids.length - LEGEND_MAX} more`));
    }
  }

  function drawHead() {
    const p = store.head();
    const status = p.status || '';
    title.textContent = p.title || '';
    badge.textContent = status;
    badge.className = 'nbs-badge nbs-status-' + status;
    counts.textContent = '';
    for (const s of STATES) {
      const n = (p.counts || {})[s] || 0;
      if (n) {
        counts.append(el('span', `nbs-count nbs-state-${s}`, `${n} ${s}`));
      }
    }
    stats.textContent = p.elapsed !== undefined ? fmtDuration(p.elapsed) : '';
    const best = p.best === null || p.best === undefined ? null : p.best;
    const row = best === null ? null : store.rows.get(best);
    bestLine.textContent = row ? `best: #${best} ${row.label} · loss ${fmt(row.best)}` : '';
    root.dataset.status = status;
    root.dataset.best = best === null ? '' : String(best);
  }

  function drawRows() {
    const rows = [...store.rows.values()].sort((a, b) => a.trial - b.trial);
    table.draw(rows, store.head().best, highlight, colourOf, hover);
    root.dataset.trials = String(store.rows.size);
  }

  function hover(node: HTMLElement, trial: number) {
    node.addEventListener('mouseenter', () => setHighlight(trial));
    node.addEventListener('mouseleave', () => setHighlight(null));
  }
  function setHighlight(trial: number | null) {
    if (highlight === trial) {
      return;
    }
    highlight = trial;
    table.hover(trial);
    focus();
  }

  let shownBest: number | null = null; // the best trial the table marks
  function draw(changed: IChanged) {
    const best = store.head().best ?? null;
    if (changed.all || changed.head || changed.rows) {
      drawHead();
    }
    if (changed.all || changed.rows || best !== shownBest) {
      shownBest = best;
      drawRows();
    }
    if (changed.all || changed.rows || changed.metrics) {
      drawLegend();
      drawCharts(changed);
    }
    root.dataset.points = String(store.points);
  }

  root.addEventListener('mouseleave', () => setHighlight(null));
  return follow(root, store, draw, [charts]);
}
