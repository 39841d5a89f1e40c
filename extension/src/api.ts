/**
 * What the server's endpoints return, and one typed function per endpoint.
 *
 * Every string in these records may come from an engine (host names, messages): the panel
 * renders them as React text children, never as HTML.
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
}

/** One rank's failure, as a finished run keeps it. */
export interface IFailure {
  rank: number;
  summary: string;
  kind: string;
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
  heartbeat_age: number | null;
  last_report_age: number | null;
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

export function listClusters(): Promise<{ clusters: ICluster[] }> {
  return requestAPI('clusters');
}

export function startCluster(n: number): Promise<ICluster> {
  return requestAPI('clusters', { method: 'POST', body: JSON.stringify({ n }) });
}

export function stopCluster(clusterId: string): Promise<ICluster> {
  return requestAPI(`clusters/${encodeURIComponent(clusterId)}`, { method: 'DELETE' });
}

export function listRuns(limit = 20): Promise<{ runs: IRun[] }> {
  return requestAPI(`runs?limit=${limit}`);
}

export function runMetrics(
  runId: number,
  sinceId: number
): Promise<{ metrics: IMetric[]; last_id: number }> {
  return requestAPI(`runs/${runId}/metrics?since_id=${sinceId}`);
}

export function runHealth(runId: number): Promise<{ workers: IWorker[] }> {
  return requestAPI(`runs/${runId}/health`);
}
