/**
 * The sweep's state in the browser, one per model, shared by its views: each metric's curves by
 * trial, and the trials' rows.
 */
import { mergeAll, Series } from '../series';
import { BoardStore, IChanged } from '../store';
import { IHead, ITrialRow, Message, RATE } from './messages';

export class SweepStore extends BoardStore<IHead, Message> {
  /** metric -> trial -> its curve */
  declare metrics: Map<string, Map<number, Series>>;
  /** trial -> its row */
  declare rows: Map<number, ITrialRow>;
  /** loss points received (the browser test reads it) */
  declare points: number;

  protected reset(): void {
    this.metrics = new Map();
    this.rows = new Map();
    this.points = 0;
  }

  protected merge(msg: Message): IChanged {
    const changed: IChanged = {};
    const whole = msg.kind === 'history';
    for (const [name, trials] of Object.entries(msg.metrics || {})) {
      let curves = this.metrics.get(name);
      if (!curves) {
        curves = new Map();
        this.metrics.set(name, curves);
      }
      const count = mergeAll(curves, trials, whole);
      this.points += name === 'loss' ? count : 0;
      (changed.metrics ||= new Set()).add(name);
    }
    for (const row of msg.rows || []) {
      this.rows.set(row.trial, row);
    }
    if (msg.rows && msg.rows.length) {
      changed.rows = true;
    }
    return changed;
  }

  /** The metrics other than loss and samples/s, in the order they were first reported. */
  others(): string[] {
    return [...this.metrics.keys()].filter(n => n !== 'loss' && n !== RATE);
  }

  /** Every trial with a row or a curve, by id. */
  trials(): number[] {
    const ids = new Set(this.rows.keys());
    for (const curves of this.metrics.values()) {
      for (const t of curves.keys()) {
        ids.add(t);
      }
    }
    return [...ids].sort((a, b) => a - b);
  }
}
