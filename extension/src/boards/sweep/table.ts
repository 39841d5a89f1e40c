/**
 * The sweep's trials table: a row per trial (its colour and id, values, state, ranks, step,
 * loss, best loss, samples/s, note), the best trial marked. Trial values, notes and errors are
 * set as text.
 */
import { el } from '../../dom';
import { columnFormat, fmtInt, MISSING } from '../../format';
import { ITrialRow } from './messages';

type Key = keyof ITrialRow;

const COLUMNS: [Key, string][] = [
  ['trial', 'trial'],
  ['label', 'values'],
  ['state', 'state'],
  ['ranks', 'ranks'],
  ['step', 'step'],
  ['loss', 'loss'],
  ['best', 'best loss'],
  ['samples_per_s', 'samples/s'],
  ['note', 'note']
];

export class TrialTable {
  readonly node = el('div', 'nbs-table-box');
  /** the rows' elements */
  readonly tbody = el('tbody');

  constructor() {
    const table = el('table', 'nbs-table');
    const hrow = el('tr');
    for (const [, label] of COLUMNS) {
      hrow.append(el('th', '', label));
    }
    const thead = el('thead');
    thead.append(hrow);
    table.append(thead, this.tbody);
    this.node.append(table);
  }

  /** `rows` by trial; `best`: the leader; `highlight`: the trial under the pointer. Each row is
   * handed to `made` (to follow the pointer). */
  draw(
    rows: ITrialRow[],
    best: number | null | undefined,
    highlight: number | null,
    colourOf: (trial: number) => string,
    made: (tr: HTMLElement, trial: number) => void
  ): void {
    const lossFormat = columnFormat(
      rows.flatMap(r => [r.loss, r.best]).filter((v): v is number => typeof v === 'number')
    );
    this.tbody.textContent = '';
    for (const row of rows) {
      const t = row.trial;
      const tr = el('tr', 'nbs-row-' + row.state);
      tr.dataset.trial = String(t);
      if (t === best) {
        tr.classList.add('nbs-leader');
      }
      if (t === highlight) {
        tr.classList.add('nbs-hover');
      }
      for (const [key] of COLUMNS) {
        const v = row[key];
        const td = el('td', 'nbs-col-' + key);
        if (key === 'trial') {
          const sw = el('span', 'nbs-swatch');
          sw.style.setProperty('--nbs-key', colourOf(t));
          td.append(sw, el('span', '', `#${t}`));
          if (t === best) {
            const star = el('span', 'nbs-star', '★ best');
            star.title = 'lowest best loss';
            td.append(star);
          }
        } else if (key === 'state') {
          td.append(el('span', 'nbs-state nbs-state-' + v, row.state));
        } else if (key === 'step' || key === 'samples_per_s') {
          td.textContent = fmtInt(row[key]);
        } else if (key === 'loss' || key === 'best') {
          td.textContent = typeof v === 'string' ? v : lossFormat(v);
        } else {
          td.textContent = String(v || (key === 'note' ? '' : MISSING));
          if (key === 'note' && v) {
            td.title = String(v);
          }
        }
        tr.append(td);
      }
      made(tr, t);
      this.tbody.append(tr);
    }
  }

  /** Mark the row of `trial` (null: none) as under the pointer. */
  hover(trial: number | null): void {
    for (const tr of Array.from(this.tbody.children) as HTMLElement[]) {
      tr.classList.toggle('nbs-hover', tr.dataset.trial === String(trial));
    }
  }
}
