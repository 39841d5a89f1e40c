/**
 * The sidebar panel: state, polling, and the actions (start, stop).
 *
 * While the focused run is live and the panel visible, its workers and metrics refresh four
 * times a second (a dead rank shows within a second of its death), the clusters and the run
 * list once a second. Otherwise everything refreshes every second while the panel is visible,
 * every 15 s while it is hidden, and not at all while the browser tab is hidden. When the
 * server cannot be reached the poll backs off (up to 30 s) and the panel says so at the top.
 */
import { ReactWidget } from '@jupyterlab/ui-components';
import { Poll } from '@lumino/polling';
import { Message } from '@lumino/messaging';
import React from 'react';

import {
  IMetric,
  IWorker,
  listClusters,
  listRuns,
  runHealth,
  runMetrics,
  startCluster,
  stopCluster
} from './api';
import { ApiError, Unreachable } from './request';
import { IPanelState } from './state';
import { Sidebar } from './views';

const LIVE_MS = 250; // a live run's workers and metrics, while the panel is visible
const VISIBLE_MS = 1000;
const HIDDEN_MS = 15000;
const MAX_BACKOFF_MS = 30000;
const MAX_POINTS = 400;

export class SidebarPanel extends ReactWidget {
  constructor() {
    super();
    this.addClass('jp-nbdist-Sidebar');
    this._poll = new Poll({
      auto: true,
      factory: () => this._refresh(),
      frequency: { interval: VISIBLE_MS, backoff: true, max: MAX_BACKOFF_MS },
      name: 'nbdist:sidebar',
      standby: 'when-hidden'
    });
  }

  dispose(): void {
    this._poll.dispose();
    super.dispose();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._pace();
    void this._poll.refresh();
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this._pace();
  }

  protected render(): JSX.Element {
    return (
      <Sidebar
        state={this._state}
        onStart={n => void this._start(n)}
        onStop={id => void this._stop(id)}
        onRefresh={() => void this._poll.refresh()}
      />
    );
  }

  /** Poll fast only while it pays: a live run in a visible panel, and the server answering
   * (after an error the poll backs off from the 1 s pace). */
  private _pace(): void {
    const live = this._state.focus?.status === 'running' && !this._failing;
    const interval = !this.isVisible ? HIDDEN_MS : live ? LIVE_MS : VISIBLE_MS;
    this._poll.frequency = { ...this._poll.frequency, interval };
  }

  private async _refresh(): Promise<void> {
    try {
      const live = this._state.focus?.status === 'running' && this.isVisible;
      if (live && Date.now() - this._lastFull < VISIBLE_MS - LIVE_MS / 2) {
        await this._refreshLive();
      } else {
        await this._refreshAll();
      }
      this._failing = false;
    } catch (error) {
      this._failing = true;
      if (error instanceof Unreachable) {
        this._patch({ unreachable: true });
      } else {
        this._patch({ error: errorText(error) });
      }
      throw error; // the poll backs off
    } finally {
      this._pace();
    }
  }

  /** Clusters, runs, and the focused run's workers and new metrics. */
  private async _refreshAll(): Promise<void> {
    this._lastFull = Date.now();
    const [clusters, runs] = await Promise.all([listClusters(), listRuns(20)]);
    const runList = runs.runs;
    const focus = runList.find(r => r.status === 'running') ?? runList[0] ?? null;
    if (focus?.id !== this._focusId) {
      this._focusId = focus?.id ?? null;
      this._sinceId = 0;
      this._curve = [];
    }
    const workers = focus ? await this._readFocus(focus.id) : [];
    this._patch({
      clusters: clusters.clusters,
      runs: runList,
      focus,
      curve: this._curve,
      workers,
      loaded: true,
      unreachable: false,
      lastOk: Date.now()
    });
  }

  /** Only the live run's workers and new metrics (its status comes with the next full one). */
  private async _refreshLive(): Promise<void> {
    const focusId = this._focusId;
    if (focusId === null) {
      return;
    }
    const workers = await this._readFocus(focusId);
    if (focusId !== this._focusId) {
      return;
    }
    if (deadCount(workers) > deadCount(this._state.workers)) {
      this._lastFull = 0; // a rank died: its engine and the run's status follow at the next tick
    }
    this._patch({ curve: this._curve, workers, unreachable: false, lastOk: Date.now() });
  }

  /** The run's workers; its metrics since the last read go onto the curve. */
  private async _readFocus(runId: number): Promise<IWorker[]> {
    const [metrics, health] = await Promise.all([
      runMetrics(runId, this._sinceId),
      runHealth(runId)
    ]);
    if (runId === this._focusId) {
      this._addMetrics(metrics.metrics);
    }
    return health.workers;
  }

  private _addMetrics(rows: IMetric[]): void {
    // The curve follows rank 0: every rank sees the same loss after DDP's all-reduce. Rows
    // already taken (a refresh that overlapped another) are skipped by their id.
    for (const m of rows) {
      if (m.id <= this._sinceId) {
        continue;
      }
      this._sinceId = m.id;
      if (m.rank === 0 && m.step !== null && m.loss !== null && Number.isFinite(m.loss)) {
        this._curve.push({ step: m.step, loss: m.loss });
      }
    }
    if (this._curve.length > MAX_POINTS) {
      this._curve = this._curve.slice(-MAX_POINTS);
    }
  }

  private async _start(n: number): Promise<void> {
    await this._act(() => startCluster(n));
  }

  private async _stop(clusterId: string): Promise<void> {
    await this._act(() => stopCluster(clusterId));
  }

  private async _act(action: () => Promise<unknown>): Promise<void> {
    this._patch({ busy: true, error: '' });
    try {
      await action();
    } catch (error) {
      this._patch({ error: errorText(error) });
    } finally {
      this._patch({ busy: false });
      void this._poll.refresh();
    }
  }

  private _patch(part: Partial<IPanelState>): void {
    this._state = { ...this._state, ...part };
    this.update();
  }

  private _poll: Poll;
  private _focusId: number | null = null;
  private _sinceId = 0;
  private _lastFull = 0; // when clusters and runs were last read (ms)
  private _failing = false; // the last refresh failed: no fast pace until one succeeds
  private _curve: { step: number; loss: number }[] = [];
  private _state: IPanelState = {
    clusters: [],
    runs: [],
    focus: null,
    curve: [],
    workers: [],
    loaded: false,
    unreachable: false,
    error: '',
    busy: false,
    lastOk: 0
  };
}

function deadCount(workers: IWorker[]): number {
  return workers.filter(w => w.state === 'dead').length;
}

function errorText(error: unknown): string {
  if (error instanceof ApiError || error instanceof Unreachable) {
    return error.message;
  }
  return String(error);
}
