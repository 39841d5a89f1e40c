/**
 * The run's state in the browser, one per model, shared by its views: each metric's curves per
 * rank and their mean, samples/s and the spans spent recovering, the workers' rows, events, log
 * tails and the profile.
 */
import { into, mergeAll, Series } from '../series';
import { BoardStore, IChanged } from '../store';
import { IEvent, IHead, IProfile, IRankRow, Message, Span } from './messages';

/** Ordinary events kept (as the kernel's history does), beside those of the recoveries. */
export const EVENTS_KEPT = 500;
/** Events that tell a failure or a recovery kept in view: the latest (the kernel's too). */
const KEPT_EVENTS = 24;

/**
 * The events in view, in order: the `latest` ordinary ones and, beside them, the latest
 * `KEPT_EVENTS` of those that tell a failure or a recovery (`kept`), however many came after
 * (the kernel's `shown.in_view` is the same rule).
 */
export function inView(events: IEvent[], latest: number): IEvent[] {
  const left = { ordinary: latest, kept: KEPT_EVENTS };
  const out: IEvent[] = [];
  for (let i = events.length - 1; i >= 0 && left.ordinary + left.kept > 0; i--) {
    const which = events[i].kept ? 'kept' : 'ordinary';
    if (left[which] > 0) {
      left[which]--;
      out.push(events[i]);
    }
  }
  return out.reverse();
}

export interface IDashboardChanged extends IChanged {
  rate?: boolean;
  events?: boolean;
  logs?: boolean;
  profile?: boolean;
}

export interface IMetricSeries {
  ranks: Map<number, Series>;
  mean: Series;
  /** many ranks: the band about the mean (their lowest, their highest), and the outliers,
   * the farthest first (`ranks` holds theirs alone) */
  lo: Series | null;
  hi: Series | null;
  outliers: number[];
}

export class DashboardStore extends BoardStore<IHead, Message, IDashboardChanged> {
  declare metrics: Map<string, IMetricSeries>;
  declare rate: Series;
  /** the spans spent recovering (the last one open while the run recovers) */
  declare recovering: Span[];
  declare rows: Map<number, IRankRow>;
  declare events: IEvent[];
  /** rank -> its last lines */
  declare logs: Map<number, string[]>;
  /** where a step's time went on each rank (--profile), at the end */
  declare profile: IProfile | null;
  /** loss points received (the browser test reads it) */
  declare points: number;

  protected reset(): void {
    this.metrics = new Map();
    this.rate = new Series();
    this.recovering = [];
    this.rows = new Map();
    this.events = [];
    this.logs = new Map();
    this.profile = null;
    this.points = 0;
  }

  protected merge(msg: Message): IDashboardChanged {
    const changed: IDashboardChanged = {};
    const whole = msg.kind === 'history';
    for (const [name, m] of Object.entries(msg.metrics || {})) {
      let cur = this.metrics.get(name);
      if (!cur) {
        cur = { ranks: new Map(), mean: new Series(), lo: null, hi: null, outliers: [] };
        this.metrics.set(name, cur);
      }
      const count = mergeAll(cur.ranks, m.ranks || {}, whole);
      this.points += name === 'loss' ? count : 0;
      if (m.mean) {
        cur.mean = into(cur.mean, m.mean, whole);
      }
      if (m.lo) {
        cur.lo = into(cur.lo ?? undefined, m.lo, whole);
      }
      if (m.hi) {
        cur.hi = into(cur.hi ?? undefined, m.hi, whole);
      }
      if (whole) {
        cur.outliers = m.outliers ?? [];
      }
      (changed.metrics ||= new Set()).add(name);
    }
    if (msg.rate) {
      this.rate = into(this.rate, msg.rate, whole);
      changed.rate = true;
    }
    if (msg.recovering) {
      this.recovering = msg.recovering;
      changed.rate = true;
    }
    for (const row of msg.rows || []) {
      this.rows.set(row.rank, row);
    }
    if (msg.rows && msg.rows.length) {
      changed.rows = true;
    }
    if (msg.events && msg.events.length) {
      this.events = inView(this.events.concat(msg.events), EVENTS_KEPT);
      changed.events = true;
    }
    if (whole) {
      this.logs.clear();
    }
    for (const [rank, lines] of Object.entries(msg.logs || {})) {
      this.logs.set(Number(rank), lines);
    }
    if (msg.logs || whole) {
      changed.logs = true;
    }
    if (whole) {
      this.profile = msg.profile || null;
      changed.profile = true;
    }
    return changed;
  }

  /** Whether the run is recovering now (its last span spent recovering is open). */
  isRecovering(): boolean {
    const last = this.recovering[this.recovering.length - 1];
    return !!last && last[1] === null;
  }

  /** The metrics other than loss, in the order they were first reported. */
  others(): string[] {
    return [...this.metrics.keys()].filter(name => name !== 'loss');
  }
}
