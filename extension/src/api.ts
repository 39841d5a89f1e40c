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
}

/** A run, as the run store lists it. */
export interface IRun {
  id: number;
  name: string;
  label: string;
  started: number;
  ended: number | null;
  updated: number;
  status: string;
  cluster_id: string;
  world_size: number;
  step: number | null;
  total: number | null;
  loss: number | null;
  nonfinite: string | null;
  samples_per_s: number | null;
}

/** One metric row of one rank. */
export interface IMetric {
  id: number;
  time: number;
  rank: number;
  step: number | null;
  loss: number | null;
  nonfinite: string | null;
  samples: number | null;
}

/** One rank's latest health. `state`: ok, slow, silent or dead. */
export interface IWorker {
  rank: number;
  time: number;
  host: string;
  state: string;
  cpu: number | null;
  rss: number | null;
  step_time: number | null;
  heartbeat_age: number | null;
  last_report_age: number | null;
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
