/**
 * What the server's endpoints return, and one typed function per endpoint.
 *
 * Every string in these records may come from an engine (host names, messages): the panel
 * renders them as React text children, never as HTML. Every answer is strict JSON: a number
 * the server cannot send as one (NaN, infinity) is null, hence `number | null` throughout.
 */
import { requestAPI } from './request';

/** One engine process of a cluster. */
export interface IEngine {
  pid: number;
  rank: number | null;
  alive: boolean;
}

/** The Slurm job holding a kernel's engines (`server.clusters`), as Slurm tells it. */
export interface IJob {
  id: string;
  state: string;
  reason: string;
  time_left: string;
  line: string;
}

/** A cluster: started from the sidebar (`owner: "sidebar"`) or by a notebook kernel. */
export interface ICluster {
  cluster_id: string | null;
  owner: 'sidebar' | 'kernel';
  state: 'starting' | 'running' | 'stopping' | 'failed';
  pid: number | null;
  n: number | null;
  started: number | null;
  backend: string | null;
  engines: IEngine[];
  error?: string;
  job: IJob | null;
}

/** A run's status in the store (`telemetry.events.RUN_STATUSES`). */
export type RunStatus = 'running' | 'ok' | 'failed' | 'interrupted' | 'stopped' | 'lost';

/**
 * A rank's state as the kernel judges it (`telemetry.events.STATES`): while its cell runs (ok,
 * slow, silent), then how it ended (dead: its engine is gone; done; failed: its own code raised;
 * stopped: by a peer's failure, an interrupt or a timeout).
 */
export type WorkerState = 'ok' | 'slow' | 'silent' | 'dead' | 'done' | 'failed' | 'stopped';

/** A run, as the run store lists it (`telemetry.events.RUN_FIELDS`). */
export interface IRun {
  id: number;
  name: string;
  label: string;
  started: number;
  ended: number | null;
  updated: number;
  status: RunStatus;
  cluster_id: string;
  world_size: number;
  step: number | null;
  total: number | null;
  loss: number | null;
  nonfinite: string | null;
  samples_per_s: number | null;
  options: Record<string, unknown>;
  /** The failing rank and its error, one line ("rank 1: KeyError: 'b'"); "" if none. */
  error: string;
  /** False for a cell of the session that is not a run (listed only when asked: `all`). */
  listed: boolean;
  /** Each metric's last, least and greatest mean over ranks (`telemetry.listing`). */
  summary: Record<string, IMetricSummary>;
}

/** One metric of a run's summary: its mean over ranks, last, least and greatest. */
export interface IMetricSummary {
  last: number | null;
  min: number | null;
  max: number | null;
}

/** One rank's failure, as a finished run keeps it. */
export interface IFailure {
  rank: number;
  summary: string;
  kind: string;
  /** When it failed (seconds since the epoch; 0 when an older store did not keep it). */
  at: number;
}

/** One run with what only `runs/ID` returns (`telemetry.events.RUN_DETAIL_FIELDS`). */
export interface IRunDetail extends IRun {
  source: string;
  failures: IFailure[];
  kernel_pid: number | null;
}

/** One metric row of one rank (`telemetry.events.METRIC_COLUMNS`, with its row id). */
export interface IMetric {
  id: number;
  time: number;
  rank: number;
  step: number | null;
  loss: number | null;
  nonfinite: string | null;
  samples: number | null;
  extra: Record<string, unknown>;
}

/**
 * A page of a run's metric rows (`runs/ID/metrics`, `server.pages`): at most `limit` rows
 * after `since_id`. No answer holds a long run's every row: charts read `runs/ID/curves`.
 */
export interface IMetricsPage {
  metrics: IMetric[];
  /** The id of the last row sent (or the `since_id` asked with): a live run's next poll. */
  last_id: number;
  /** The `since_id` of the next page; null when this page holds every row stored now. */
  next: number | null;
}

/** One rank's latest health (`telemetry.events.WorkerHealth`). */
export interface IWorker {
  rank: number;
  time: number;
  host: string;
  state: WorkerState;
  cpu: number | null;
  rss: number | null;
  gpu_util: number | null;
  gpu_mem: number | null;
  step_time: number | null;
  comm_share: number | null;
  /** The share of its steps spent waiting for the next batch, or null when no nbdist loader ran. */
  data_share: number | null;
  heartbeat_age: number | null;
  last_report_age: number | null;
  /** Its coordinates in its `nbdist.mesh` ("dp 1/2 tp 0/2"), or null without a mesh. */
  mesh: string | null;
}

/** One event of a run (`telemetry.events.RunEvent`, with its row id); `rank` null: the run's. */
export interface IEvent {
  id: number;
  time: number;
  kind: string;
  rank: number | null;
  message: string;
  data: Record<string, unknown>;
}

/** A run's events (`runs/ID/events`): its latest, or a page after `since_id`, oldest first. */
export interface IEventsPage {
  events: IEvent[];
  last_id: number;
  next: number | null;
  /** How many events the run has: more than `events` holds when the latest are sent. */
  total: number;
}

/** A line of points: `x` ascending (steps, or seconds since the run started), `y` its values. */
export interface ILineData {
  x: number[];
  y: number[];
}

/** One rank's line of a metric. */
export interface IRankLine extends ILineData {
  rank: number;
}

/** A metric's band over many ranks: their lowest (`lo`) and highest (`hi`) value at each step. */
export interface IBandData {
  lo: ILineData;
  hi: ILineData;
  /** How many ranks it spans. */
  ranks: number;
}

/**
 * One metric of a run: the mean over ranks, and each rank's line when asked (`ranks=1`). Past 8
 * ranks (`telemetry.spread`, the board's rule) `ranks` holds the outlier ranks' lines alone, and
 * `band` (null until a step has settled) and `outliers` (the farthest first) come with them.
 */
export interface IMetricCurves {
  name: string;
  mean: ILineData;
  ranks: IRankLine[];
  band?: IBandData | null;
  outliers?: number[];
}

/**
 * A run's curves (`runs/ID/curves`, `server.curves`): every metric's name in the order first
 * reported, the curves asked for, cut to at most `points` points a line.
 */
export interface ICurves {
  run_id: number;
  names: string[];
  metrics: IMetricCurves[];
  /** Steps completed by the slowest reporting rank, as the run's `step` counts them. */
  done: number | null;
  /** Metric rows folded so far. */
  rows: number;
  /** False while the server is still reading a long run's rows: ask again. */
  complete: boolean;
  /** Metrics past the 50 charted. */
  dropped: number;
}

/** One rank's health over time (`runs/ID/health/history`): x in seconds since the start. */
export interface IRankHealth {
  rank: number;
  measures: Record<string, ILineData>;
  /** [seconds since the start, state] at each change of its state. */
  states: [number, WorkerState][];
}

/** Every rank's health over time. */
export interface IHealthHistory {
  run_id: number;
  started: number;
  measures: string[];
  ranks: IRankHealth[];
  rows: number;
  complete: boolean;
}

/** What a curves request asks for. */
export interface ICurvesQuery {
  points: number;
  ranks?: boolean;
  metrics?: string[];
}

export function listClusters(): Promise<{ clusters: ICluster[] }> {
  return requestAPI('clusters');
}

export function startCluster(n: number): Promise<ICluster> {
  return requestAPI('clusters', { method: 'POST', body: JSON.stringify({ n }) });
}

export function stopCluster(clusterId: string): Promise<ICluster> {
  return requestAPI(`clusters/${encodeURIComponent(clusterId)}`, { method: 'DELETE' });
}

/**
 * What a page of runs asks for (`GET runs`, `telemetry.listing`): a part of the name (`q`),
 * statuses ("ok,failed"), a sort (time, duration, name, status, step, or a summary metric:
 * "loss", "min:loss"), its order ("" for the sort's own), the session's other cells (`all`).
 */
export interface IRunsQuery {
  offset?: number;
  limit?: number;
  q?: string;
  status?: string;
  sort?: string;
  order?: '' | 'asc' | 'desc';
  all?: boolean;
}

/** A page of runs: `total` counts every run the query finds; `metrics`, what runs sort by. */
export interface IRunsPage {
  runs: IRun[];
  total: number;
  offset: number;
  limit: number;
  metrics: string[];
}

export function listRuns(query: IRunsQuery = {}): Promise<IRunsPage> {
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(query)) {
    if (value !== undefined && value !== '' && value !== false) {
      params.set(key, value === true ? '1' : String(value));
    }
  }
  return requestAPI(`runs?${params.toString()}`);
}

export function getRun(runId: number): Promise<{ run: IRunDetail }> {
  return requestAPI(`runs/${runId}`);
}

export function runCurves(runId: number, query: ICurvesQuery): Promise<ICurves> {
  const params = new URLSearchParams({ points: String(query.points) });
  if (query.ranks) {
    params.set('ranks', '1');
  }
  if (query.metrics && query.metrics.length) {
    params.set('metrics', query.metrics.join(','));
  }
  return requestAPI(`runs/${runId}/curves?${params.toString()}`);
}

export function runHealthHistory(runId: number, points: number): Promise<IHealthHistory> {
  return requestAPI(`runs/${runId}/health/history?points=${points}`);
}

export function runEvents(runId: number): Promise<IEventsPage> {
  return requestAPI(`runs/${runId}/events`);
}

export function runMetrics(runId: number, sinceId = 0, limit = 1000): Promise<IMetricsPage> {
  return requestAPI(`runs/${runId}/metrics?since_id=${sinceId}&limit=${limit}`);
}

export function runHealth(runId: number): Promise<{ workers: IWorker[] }> {
  return requestAPI(`runs/${runId}/health`);
}
