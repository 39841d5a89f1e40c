/**
 * What the kernel sends the sweep's board, as nbdist/notebook/sweeps/board.py sends it: `head`
 * (a synced trait: status, counts, the best trial), `history` (a synced trait: everything so
 * far, decimated, refreshed every few seconds) and deltas (custom messages: new points, the rows
 * that changed). Numbers are finite or null (a latest loss that is not finite travels as text:
 * "nan"); text from engines and users is text, set as text.
 */
import { SentPoints } from '../series';
import { IMessage } from '../store';

/** A trial's state (`sweeps.board.STATES`), in the order the head counts them. */
export const STATES = ['queued', 'running', 'done', 'failed', 'stopped'] as const;
export type TrialState = (typeof STATES)[number];

/** The kernel's name of a trial's throughput curve (`sweeps.board.RATE`). */
export const RATE = 'samples/s';

/** The head (`SweepBoard._head`). */
export interface IHead {
  title: string;
  /** "running", then "ok", "interrupted" or "failed" */
  status: string;
  /** trials by state */
  counts: Record<TrialState, number>;
  trials: number;
  /** the trial with the lowest best loss */
  best: number | null;
  /** whole seconds since the start */
  elapsed: number;
}

/** A trial's row of the table (`SweepBoard.set_trial`). */
export interface ITrialRow {
  trial: number;
  /** its values: "lr=0.1, width=32" */
  label: string;
  state: TrialState;
  /** the ranks it runs on */
  ranks: string;
  step: number | null;
  loss: number | string | null;
  best: number | null;
  samples_per_s: number | null;
  /** why it stopped, its error */
  note: string;
}

/** Each metric's (and RATE's) points, by trial (as text). */
export type TrialPoints = Record<string, Record<string, SentPoints>>;

/** Everything so far, decimated: where a view starts. */
export interface IHistory extends IMessage {
  kind: 'history';
  rows: ITrialRow[];
  metrics: TrialPoints;
}

/** What is new since the last message; each part only when something changed. */
export interface IDelta extends IMessage {
  kind: 'delta';
  metrics?: TrialPoints;
  rows?: ITrialRow[];
}

export type Message = IHistory | IDelta;
