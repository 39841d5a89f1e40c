/**
 * The workers' table: a row per rank (its host, its engine's pid, state, steps, loss, step time,
 * CPU, memory, GPU, time in collectives, waiting for data...), one number format per column.
 * Columns no rank has a value for (the data wait, a mesh's coordinates, a pipeline's stage and
 * idle share) are left out. A rank is one row through the run's attempts: a fresh engine that
 * recovery put in place of a lost one shows its own pid, marked ↻ (its title names the lost
 * ones), on the rank's row, its history kept.
 */
import { el } from '../../dom';
import { columnFormat, fmtInt, MISSING } from '../../format';
import { IRankRow } from './messages';

type Key = keyof IRankRow;

const COLUMNS: [Key, string][] = [
  ['rank', 'rank'],
  ['host', 'host'],
  ['pid', 'pid'],
  ['state', 'state'],
  ['steps', 'steps'],
  ['loss', 'last loss'],
  ['step_ms', 'step ms'],
  ['cpu', 'cpu %'],
  ['rss_mb', 'rss MB'],
  ['gpu_util', 'gpu %'],
  ['gpu_mb', 'gpu MB'],
  ['comm', 'comm %'],
  ['data', 'data %'],
  ['pp', 'pp'],
  ['dp', 'dp'],
  ['tp', 'tp'],
  ['stage', 'stage'],
  ['idle', 'idle %'],
  ['quiet', 'quiet s']
];
// Columns shown only when some rank has a value: its wait for data (an nbdist loader's), its
// coordinates in a mesh (nbdist.mesh: "0/2" along each dimension), a pipeline's stage and its
// idle (bubble) share.
const MESH: Key[] = ['pp', 'dp', 'tp'];
const OPTIONAL = new Set<Key>(['data', ...MESH, 'stage', 'idle']);
const TEXT = new Set<Key>(['host', 'state', 'stage']);
const TITLES: Partial<Record<Key, string>> = {
  pp: "its stage along the mesh's pp dimension (nbdist.mesh): index / size",
  dp: "its replica along the mesh's dp dimension (nbdist.mesh): index / size",
  tp: "its shard along the mesh's tp dimension (nbdist.mesh): index / size",
  data: 'the share of its steps spent waiting for the next batch (from one batch handed out to the next), over its latest second or so',
  loss: "each rank's latest loss, at its latest step (the cell's title names it); the head's is their mean at the step all have passed"
};
const WHOLE = new Set<Key>(['rank', 'steps', 'quiet']);

export class RankTable {
  readonly node = el('div', 'nbd-table-box');

  constructor() {
    const table = el('table', 'nbd-table');
    const thead = el('thead');
    thead.append(this.hrow);
    table.append(thead, this.tbody);
    this.node.append(table);
  }

  /** The rows, by rank; `loss`: the board's format of the loss (the head and the chart's). */
  draw(rows: IRankRow[], loss: (v: number | null) => string): void {
    const columns = COLUMNS.filter(
      ([key]) => !OPTIONAL.has(key) || rows.some(row => row[key] !== null && row[key] !== undefined)
    );
    // one format per column: 0.001658 never stands beside 2.90e-4
    const formats = new Map(
      columns.map(([key]) => [
        key,
        WHOLE.has(key)
          ? fmtInt
          : key === 'loss'
            ? loss
            : columnFormat(rows.map(row => (typeof row[key] === 'number' ? row[key] : null)))
      ])
    );
    this.hrow.textContent = '';
    for (const [key, label] of columns) {
      const th = el('th', '', label);
      const title = TITLES[key];
      if (title) {
        th.title = title;
      }
      this.hrow.append(th);
    }
    this.tbody.textContent = '';
    for (const row of rows) {
      const tr = el('tr', 'nbd-row-' + row.state);
      tr.dataset.rank = String(row.rank);
      for (const [key] of columns) {
        const td = cell(row, key, formats.get(key) ?? fmtInt);
        td.dataset.col = key;
        tr.append(td);
      }
      this.tbody.append(tr);
    }
  }

  private readonly hrow = el('tr');
  private readonly tbody = el('tbody');
}

function cell(row: IRankRow, key: Key, format: (v: number | null) => string): HTMLElement {
  const v = row[key];
  if (key === 'state') {
    const td = el('td');
    const state = el('span', 'nbd-state nbd-state-' + v, row.state);
    if (row.error) {
      state.title = row.error;
    }
    td.append(state);
    return td;
  }
  if (key === 'pid') {
    const td = el('td', 'nbd-num nbd-pid', row.pid === null ? MISSING : String(row.pid));
    if (row.replaced && row.replaced.length) {
      td.classList.add('nbd-replaced');
      td.textContent += ' ↻';
      td.title = `its engine was replaced by recovery: pid ${[...row.replaced, row.pid].join(' → ')}`;
    }
    return td;
  }
  if (MESH.includes(key)) {
    const td = el('td', 'nbd-num nbd-mesh', String(v || MISSING));
    td.dataset.dim = key;
    return td;
  }
  if (TEXT.has(key)) {
    return el('td', 'nbd-' + key, String(v || MISSING));
  }
  const td = el(
    'td',
    'nbd-num',
    typeof v === 'string' ? v : format(typeof v === 'number' ? v : null)
  );
  if (key === 'loss' && row.loss_step !== null && row.loss_step !== undefined) {
    td.title = `rank ${row.rank}'s loss at step ${fmtInt(row.loss_step)}`;
  }
  return td;
}
