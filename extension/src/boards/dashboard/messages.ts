/**
 * What the kernel sends the run's dashboard, as nbdist/notebook/board/dashboard.py sends it:
 * `head` (a synced trait, replaced at each update), `history` (a synced trait: everything so
 * far, decimated, refreshed every few seconds) and deltas (custom messages: what is new). Numbers
 * are finite or null (a loss that is not finite travels as text: "nan"); text from engines is
 * text, set as text.
 */
import { SentPoints } from '../series';
import { IMessage } from '../store';

/** The progress line (`Dashboard._head`). */
export interface IHead {
  title: string;
  /** "running", "ok", "failed", "interrupted", "recovering …": its first word styles the badge */
  status: string;
  /** steps done, counted as the run's progress is */
  steps: number | null;
  total: number | null;
  /** seconds left, while running */
  eta: number | null;
  /** samples/s */
  rate: number | null;
  /** the mean loss over ranks at `mean_step`, the latest step every rank has passed */
  mean_loss: number | null;
  mean_step: number | null;
  /** seconds since the start */
  elapsed: number;
  ranks: number;
  /** metrics past the charted limit */
  dropped: number;
}

/** One metric's new points, or all of them: each rank's (by rank, as text) and their mean. Past
 * a few ranks (the kernel's MANY_RANKS), the band about the mean (the ranks' lowest and highest
 * value at each step) and the outlier ranks' points alone. */
export interface IMetricPoints {
  ranks?: Record<string, SentPoints>;
  mean?: SentPoints;
  lo?: SentPoints;
  hi?: SentPoints;
  /** the outlier ranks, the farthest first (a history's) */
  outliers?: number[];
}

/** A rank's row of the workers' table (`shown.rank_row`): one row through the run's attempts. */
export interface IRankRow {
  rank: number;
  host: string;
  /** its engine's pid (a fresh one after a recovery replaced the engine) */
  pid: number | null;
  /** the pids of the engines it lost before this one, oldest first */
  replaced: number[];
  /** "ok", "slow", "silent", "dead", "failed", "stopped", "done" */
  state: string;
  /** a failed rank's error, one line */
  error: string | null;
  steps: number | null;
  /** its latest loss (a text when not finite: "nan"), reported at step `loss_step` */
  loss: number | string | null;
  loss_step: number | null;
  step_ms: number | null;
  cpu: number | null;
  rss_mb: number | null;
  gpu_util: number | null;
  gpu_mb: number | null;
  /** % of the step in collectives */
  comm: number | null;
  /** % of the step waiting for the next batch (null when no nbdist loader ran) */
  data: number | null;
  /** its place along each dimension of its nbdist.mesh: "0/2" */
  pp: string | null;
  dp: string | null;
  tp: string | null;
  /** a pipeline's stage: "0/2", "1/2 r1" */
  stage: string | null;
  /** % of the step idle (a pipeline's bubble) */
  idle: number | null;
  /** whole seconds since it was last heard from (null once it ended) */
  quiet: number | null;
}

/** A run's event (`shown.event_dict`): a rank slow, silent, dead; a NaN; a restart. */
export interface IEvent {
  time: number;
  kind: string;
  rank: number | null;
  message: string;
  /** it tells a failure or a recovery: kept in view, never pushed out by later ones */
  kept: boolean;
}

/** A span of the run spent recovering, in seconds since its start (`to`: null while on). */
export type Span = [from: number, to: number | null];

/** One rank's profiled step, in ms per step (`debug.profile.ProfileRow`). */
export interface IProfileRow {
  rank: number;
  steps: number;
  step_ms: number;
  compute_ms: number;
  comm_ms: number;
  data_ms: number;
  wait_ms: number;
  /** where most of its step goes: "computing", "in collectives" or "waiting for data" */
  mostly: string;
}

/** Where a step's time went on each rank (`--profile`: `Profile.shown`), at the end. */
export interface IProfile {
  rows: IProfileRow[];
  straggler: number | null;
  reason: string;
}

/** Everything so far, decimated: where a view starts. */
export interface IHistory extends IMessage {
  kind: 'history';
  metrics: Record<string, IMetricPoints>;
  /** samples/s against seconds since the start */
  rate: SentPoints;
  /** the spans spent recovering: no samples/s is drawn across them */
  recovering: Span[];
  rows: IRankRow[];
  events: IEvent[];
  /** the last lines of the ranks whose output the cell does not show, by rank */
  logs: Record<string, string[]>;
  profile: IProfile | null;
}

/** What is new since the last message; each part only when something changed. */
export interface IDelta extends IMessage {
  kind: 'delta';
  metrics?: Record<string, IMetricPoints>;
  rate?: SentPoints;
  /** every span spent recovering, when one began or ended */
  recovering?: Span[];
  rows?: IRankRow[];
  events?: IEvent[];
  logs?: Record<string, string[]>;
}

export type Message = IHistory | IDelta;
