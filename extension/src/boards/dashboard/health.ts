/**
 * Many ranks' health at a glance: a compact grid, one cell per rank coloured by its state (ok,
 * slow, silent, dead, failed, stopped, done), its title the rank's detail (host, pid, steps, last
 * loss, step time, CPU, memory, its wait for data, how long it has been quiet, its error). A rank
 * that waits for its next batch INPUT_BOUND of its step or more is marked (a hollow cell), and
 * counted in the summary. Past MANY_RANKS the board shows this grid, and the full table behind
 * a toggle; a few ranks keep the table alone.
 */
import { el } from '../../dom';
import { fmt, fmtInt } from '../../format';
import { IRankRow } from './messages';

/** Past this many ranks: the grid, the table behind a toggle (the kernel's MANY_RANKS). */
export const MANY_RANKS = 8;
/** The share of a step (%) spent waiting for data from which a rank reads as input-bound. */
export const INPUT_BOUND = 50;

export class HealthGrid {
  readonly node = el('div', 'nbd-health');

  /** `table`: the full table's box, shown or hidden by the toggle. */
  constructor(private readonly table: HTMLElement) {
    const head = el('div', 'nbd-health-head');
    this.toggle.type = 'button';
    this.toggle.addEventListener('click', () => {
      this.open = !this.open;
      this.sync();
    });
    head.append(this.summary, this.toggle);
    this.node.append(head, this.cells);
  }

  /** The rows, by rank: the grid past MANY_RANKS, else the table alone. */
  draw(rows: IRankRow[], loss: (v: number | null) => string): void {
    this.many = rows.length > MANY_RANKS;
    this.sync();
    if (!this.many) {
      return;
    }
    const counts = new Map<string, number>();
    let bound = 0;
    this.cells.textContent = '';
    for (const row of rows) {
      counts.set(row.state, (counts.get(row.state) ?? 0) + 1);
      const cell = el('span', `nbd-cell nbd-state-${row.state}`);
      cell.dataset.rank = String(row.rank);
      cell.dataset.state = row.state;
      if (typeof row.data === 'number' && row.data >= INPUT_BOUND) {
        cell.classList.add('nbdist-input-bound');
        bound += 1;
      }
      cell.title = detail(row, loss);
      this.cells.append(cell);
    }
    const states = [...counts.entries()].map(([state, n]) => `${fmtInt(n)} ${state}`);
    if (bound) {
      states.push(`${fmtInt(bound)} waiting for data ≥ ${INPUT_BOUND} % of the step (hollow)`);
    }
    this.summary.textContent = `${fmtInt(rows.length)} ranks: ${states.join(' · ')}`;
    this.node.dataset.cells = String(rows.length);
  }

  private sync(): void {
    this.node.style.display = this.many ? '' : 'none';
    this.table.style.display = !this.many || this.open ? '' : 'none';
    this.toggle.textContent = this.open ? 'hide the table' : 'show the table';
    this.toggle.setAttribute('aria-expanded', String(this.open));
  }

  private many = false;
  private open = false;
  private readonly summary = el('span', 'nbd-health-summary');
  private readonly toggle = el('button', 'nbd-health-toggle');
  private readonly cells = el('div', 'nbd-cells');
}

/** A rank's detail, one line per figure (a cell's title). */
function detail(row: IRankRow, loss: (v: number | null) => string): string {
  const lines = [`rank ${row.rank} · ${row.state}`];
  if (row.host || row.pid !== null) {
    lines.push(`${row.host || '?'} pid ${row.pid ?? '?'}`);
  }
  if (row.steps !== null) {
    lines.push(`${fmtInt(row.steps)} steps`);
  }
  if (row.loss !== null) {
    const at = row.loss_step === null ? '' : ` at step ${fmtInt(row.loss_step)}`;
    lines.push(`last loss ${typeof row.loss === 'string' ? row.loss : loss(row.loss)}${at}`);
  }
  const figures: [number | null, string][] = [
    [row.step_ms, 'ms per step'],
    [row.cpu, '% cpu'],
    [row.rss_mb, 'MB rss'],
    [row.data, '% of the step waiting for data'],
    [row.quiet, 's quiet']
  ];
  for (const [v, unit] of figures) {
    if (v !== null && v !== undefined) {
      lines.push(`${fmt(v)} ${unit}`);
    }
  }
  if (row.error) {
    lines.push(row.error);
  }
  return lines.join('\n');
}
