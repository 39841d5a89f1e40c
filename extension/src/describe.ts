/**
 * How the sidebar and its run views name things: a run's title, its length, its step, a
 * worker's state as shown. Numbers and durations go through format.ts, so a run's length reads
 * the same on its card, in the list, in its detail view and on the notebook's board.
 */
import { IRun, IWorker, WorkerState } from './api';
import { fmt, fmtDuration, fmtInt, MISSING } from './format';

/** States of a rank whose cell is still running: only a live run may show them. */
export const LIVE_STATES: WorkerState[] = ['ok', 'slow', 'silent'];

/** Every state a tile can show, in the legend's order ('unknown': a live state left behind by
 * a run that is no longer running, e.g. a kernel that died). */
export const SHOWN_STATES = [
  'ok',
  'slow',
  'silent',
  'done',
  'failed',
  'stopped',
  'dead',
  'unknown'
] as const;

export type ShownState = (typeof SHOWN_STATES)[number];

/** "#12 name" (its label first). */
export function runTitle(r: IRun): string {
  const name = r.label || r.name;
  return name ? `#${r.id} ${name}` : `#${r.id}`;
}

/** How long the run took, or has taken so far: one rule everywhere. */
export function runLength(r: IRun): string {
  return fmtDuration((r.ended ?? r.updated) - r.started);
}

/** How long the run took, short enough for a table's column: "12.3s", "1m05s", "2h05m". */
export function runLengthShort(r: IRun): string {
  const long = runLength(r);
  return long
    .replace(/ min (\d+) s$/, 'm$1s')
    .replace(/ h (\d+) min$/, 'h$1m')
    .replace(/ s$/, 's');
}

/** The run's loss: its value, or "nan"/"inf" when it was not finite. */
export function lossText(r: IRun): string {
  return r.nonfinite ? r.nonfinite : fmt(r.loss);
}

/** "1,744 / 3,080", "1,744", or '–'. */
export function stepText(step: number | null, total: number | null): string {
  if (step === null) {
    return MISSING;
  }
  return total ? `${fmtInt(step)} / ${fmtInt(total)}` : fmtInt(step);
}

/** The state a worker's tile shows: a live state of a run that has ended is unknown. */
export function shownState(w: IWorker, run: IRun): ShownState {
  if (run.status !== 'running' && LIVE_STATES.includes(w.state)) {
    return 'unknown';
  }
  return (SHOWN_STATES as readonly string[]).includes(w.state)
    ? (w.state as ShownState)
    : 'unknown';
}

/** A worker's tooltip: where it ran, its place in the mesh, and what it measured last. */
export function workerTitle(w: IWorker): string {
  const parts = [`rank ${w.rank}`, w.host ? `on ${w.host}` : '', w.mesh ?? '', w.state];
  if (w.cpu !== null) {
    parts.push(`cpu ${fmt(w.cpu, 3)} %`);
  }
  if (w.step_time !== null) {
    parts.push(`step ${fmtDuration(w.step_time)}`);
  }
  if (w.data_share !== null && w.data_share !== undefined) {
    parts.push(`waiting for data ${fmtInt(w.data_share * 100)} % of the step`);
  }
  if (w.last_report_age !== null) {
    parts.push(`last report ${fmtDuration(w.last_report_age)} ago`);
  }
  return parts.filter(Boolean).join(' · ');
}

/** A rank's coordinate along one dimension of its mesh: "dp", 1 of 2. */
export interface IMeshCoord {
  name: string;
  index: number;
  size: number;
}

/** A worker's `mesh` ("dp 1/2 tp 0/2", as `telemetry.events.MeshCoords` writes it) read back,
 * outermost dimension first; [] without a mesh. */
export function meshCoords(text: string | null | undefined): IMeshCoord[] {
  return [...(text ?? '').matchAll(/(\w+) (\d+)\/(\d+)/g)].map(m => ({
    name: m[1],
    index: Number(m[2]),
    size: Number(m[3])
  }));
}

/** What a tile shows of its coordinates, in the key's order: "1·0". */
export function meshTile(coords: IMeshCoord[]): string {
  return coords.map(c => c.index).join('·');
}

/** The key that reads the tiles' coordinates: "mesh: dp·tp of 2×2". */
export function meshKey(coords: IMeshCoord[]): string {
  const names = coords.map(c => c.name).join('·');
  return `mesh: ${names} of ${coords.map(c => c.size).join('×')}`;
}

/** "just now", "42 s ago", "12 min ago", or the date. */
export function ago(epochSeconds: number): string {
  const s = Date.now() / 1000 - epochSeconds;
  if (s < 5) {
    return 'just now';
  }
  if (s < 90) {
    return `${Math.round(s)} s ago`;
  }
  if (s < 5400) {
    return `${Math.round(s / 60)} min ago`;
  }
  return new Date(epochSeconds * 1000).toLocaleString();
}

/** Do positive values span at least two decades? Then a log axis reads them. */
export function spansDecades(ys: ArrayLike<number | null>): boolean {
  let lo = Infinity;
  let hi = -Infinity;
  for (let i = 0; i < ys.length; i++) {
    const v = ys[i];
    if (v === null || !Number.isFinite(v)) {
      continue;
    }
    if (v <= 0) {
      return false;
    }
    lo = Math.min(lo, v);
    hi = Math.max(hi, v);
  }
  return hi / lo >= 100;
}
