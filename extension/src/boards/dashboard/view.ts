/**
 * A view of the run's dashboard: the head (title, status, progress, ETA, samples/s), the
 * smoothing slider, loss per rank and their mean (past a few ranks: the mean, the band of the ranks'
 * values and the outliers' lines, as its title says) beside samples/s (the time spent recovering a
 * band, with no line drawn across it), every other metric in a grid below (sharing the step axis
 * and the cursor), then the profile, the workers' table, events and log tails. The data
 * attributes on the root (status, points, charts, ranks) are what the browser tests read.
 */
import { el } from '../../dom';
import { fmtDuration, fmtInt } from '../../format';
import { broken, IBand } from '../../plotdata';
import { RANK_LINES, rankLines, spreadLines } from '../../smoothing';
import { BoardCharts, retitle, titleOf } from '../charts';
import { follow, syncKey } from '../view';
import { HealthGrid } from './health';
import { Format, MetricFormats } from './numbers';
import { drawProfile, EventList, LogTail } from './panels';
import { DashboardStore, IDashboardChanged } from './store';
import { RankTable } from './table';

export function render(root: HTMLElement, store: DashboardStore): () => void {
  root.classList.add('nbd-dashboard');
  const sync = syncKey('nbd'); // this view's charts share a cursor

  const head = el('div', 'nbd-head');
  const title = el('span', 'nbd-title');
  const badge = el('span', 'nbd-badge');
  const stats = el('span', 'nbd-stats');
  head.append(title, badge, stats);
  const bar = el('div', 'nbd-bar');
  const fill = el('div', 'nbd-bar-fill');
  bar.append(fill);
  const charts = new BoardCharts(
    { slider: 'nbd-smooth', smoothing: 0.6, box: 'nbd-charts', grid: { sync, height: 130 } },
    {
      title: 'loss per rank, and their mean',
      sync,
      height: 190,
      empty: 'waiting for report(loss=…)'
    },
    {
      title: 'samples / s',
      xLabel: 'seconds',
      height: 190,
      empty: 'waiting for report(samples=…)'
    },
    () => drawCharts({ all: true })
  );
  const { loss: lossChart, rate: rateChart, grid } = charts;
  grid.node.classList.add('nbd-metrics');
  const table = new RankTable();
  const health = new HealthGrid(table.node);
  const profileBox = el('div', 'nbd-profile');
  const bottom = el('div', 'nbd-bottom');
  const events = new EventList();
  const logs = new LogTail();
  bottom.append(events.node, logs.node);
  root.append(
    head,
    bar,
    charts.slider,
    charts.top,
    grid.node,
    profileBox,
    health.node,
    table.node,
    bottom
  );
  const formats = new MetricFormats();

  // A metric's one format on this board (head, table, readout), from its latest raw values:
  // its mean's, each rank's, and (the loss) the table's and the head's.
  function formatOf(name: string): Format {
    const m = store.metrics.get(name);
    const values: (number | null | undefined)[] = [];
    for (const s of m ? [m.mean, ...m.ranks.values(), ...(m.lo ? [m.lo] : [])] : []) {
      values.push(...s.y.slice(-50), ...s.view().y.slice(-2));
    }
    if (name === 'loss') {
      values.push(store.head().mean_loss);
      for (const row of store.rows.values()) {
        values.push(typeof row.loss === 'number' ? row.loss : null);
      }
    }
    return formats.of(name, values);
  }

  // A metric's lines: each rank's (while there are few) and their mean, smoothed alike; past a
  // few ranks the mean, the band about it and the outliers' own lines. Its title says which.
  function linesOf(name: string) {
    const m = store.metrics.get(name);
    if (!m) {
      return [];
    }
    const chart = name === 'loss' ? lossChart : grid.charts.get(name);
    chart?.setFormat(formatOf(name));
    const count = store.head().ranks || store.rows.size || m.ranks.size;
    if (m.lo && m.hi) {
      // many ranks: the band about the mean, and the outliers' own lines
      const outliers = m.outliers
        .filter(rank => m.ranks.has(rank))
        .map(rank => ({ rank, ...m.ranks.get(rank)!.view() }));
      if (chart) {
        chart.node.dataset.outliers = m.outliers.join(' ');
        retitle(chart, titleOf(name, count, 'band', m.outliers));
      }
      return spreadLines(m.mean.view(), m.lo.view(), m.hi.view(), outliers, charts.smoothing);
    }
    const ranks = [...m.ranks.entries()].sort(([a], [b]) => a - b);
    // past RANK_LINES ranks only their mean is drawn: no rank's points are gathered then
    const shown = ranks.length > RANK_LINES ? [] : ranks;
    if (chart) {
      const drawn = shown.length ? 'ranks' : 'mean';
      // a small chart of a few ranks keeps its metric's name alone
      const small = drawn === 'ranks' && chart !== lossChart;
      retitle(chart, small ? name : titleOf(name, Math.max(count, ranks.length), drawn));
    }
    const points = shown.map(([rank, series]) => ({ rank, ...series.view() }));
    return rankLines(points, m.mean.view(), charts.smoothing);
  }

  function drawCharts(changed: IDashboardChanged) {
    const names = changed.all ? null : (changed.metrics ?? null);
    if (!names || names.has('loss')) {
      lossChart.setLines(linesOf('loss'));
    }
    grid.draw(store.others(), linesOf, names);
    root.dataset.charts = String(1 + grid.charts.size);
  }

  // The time spent recovering: a band (open at its end while the run recovers), with no
  // samples/s drawn across it; in the "recovering" badge's colour, which reads on light and dark.
  function drawRate() {
    const now = store.head().elapsed ?? 0;
    const colour = getComputedStyle(root).getPropertyValue('--nbd-slow').trim() || '#ef6c00';
    const bands: IBand[] = store.recovering.map(([from, to]) => ({
      from,
      to: to ?? Math.max(from, now),
      label: 'recovering',
      colour
    }));
    const v = broken(store.rate.view(), bands);
    // nothing reports samples: no chart for them, the loss takes the row
    const none = !store.rate.length && !bands.length;
    charts.top.classList.toggle('nbd-no-rate', none);
    rateChart.node.style.display = none ? 'none' : '';
    rateChart.setBands(bands);
    rateChart.setLines([
      { label: 'samples/s', x: v.x, y: v.y, colour: '#1565c0', width: 1.5, gaps: true }
    ]);
  }

  function drawHead() {
    const p = store.head();
    const status = p.status || '';
    title.textContent = p.title || '';
    badge.textContent = status;
    badge.className = 'nbd-badge nbd-status-' + status.split(' ')[0];
    stats.textContent = progress(p, formatOf('loss')).join(' · ');
    const share = p.total && p.steps ? Math.min(1, p.steps / p.total) : 0;
    fill.style.width = `${(100 * share).toFixed(2)}%`;
    bar.style.display = p.total ? '' : 'none';
    root.dataset.status = status;
  }

  function drawRows() {
    const rows = [...store.rows.values()].sort((a, b) => a.rank - b.rank);
    const loss = formatOf('loss');
    health.draw(rows, loss);
    table.draw(rows, loss);
    root.dataset.ranks = String(rows.length);
  }

  function draw(changed: IDashboardChanged) {
    if (changed.all || changed.head) {
      drawHead();
    }
    if (changed.all || changed.metrics) {
      drawCharts(changed);
    }
    if (changed.all || changed.rate || (changed.head && store.isRecovering())) {
      drawRate();
    }
    if (changed.all || changed.rows) {
      drawRows();
    }
    if (changed.all || changed.events) {
      events.draw(store.events);
    }
    if (changed.all || changed.logs) {
      logs.draw(store.logs);
    }
    if (changed.all || changed.profile) {
      drawProfile(profileBox, store.profile);
    }
    root.dataset.points = String(store.points);
  }

  return follow(root, store, draw, [charts]);
}

/** The head's figures: steps (of the total, and its share), ETA, samples/s, the mean loss over
 * ranks at the latest step every rank has passed (in the loss's `format`), time. */
function progress(p: ReturnType<DashboardStore['head']>, format: Format): string[] {
  const parts: string[] = [];
  if (p.steps !== undefined && p.steps !== null) {
    parts.push(
      p.total ? `${fmtInt(p.steps)} / ${fmtInt(p.total)} steps` : `${fmtInt(p.steps)} steps`
    );
    if (p.total) {
      parts.push(`${((100 * Math.min(p.steps, p.total)) / p.total).toFixed(1)} %`);
    }
  }
  if (p.eta !== null && p.eta !== undefined) {
    parts.push(`ETA ${fmtDuration(p.eta)}`);
  }
  if (p.rate !== null && p.rate !== undefined) {
    parts.push(`${fmtInt(p.rate)} samples/s`);
  }
  if (p.mean_loss !== null && p.mean_loss !== undefined) {
    const at =
      p.mean_step === null || p.mean_step === undefined ? '' : ` at step ${fmtInt(p.mean_step)}`;
    parts.push(`mean loss ${format(p.mean_loss)}${at}`);
  }
  if (p.elapsed !== undefined) {
    parts.push(fmtDuration(p.elapsed));
  }
  return parts;
}
