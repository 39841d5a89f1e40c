/**
 * The sidebar panel: state, polling, and the actions (start, stop, open, compare).
 *
 * While the focused run is live and the panel visible, its workers refresh four times a second
 * (a dead rank shows within a second of its death) and its card curve twice a second, the
 * clusters and the runs table's page in view once a second (only that page: the table's search,
 * filter, sort and paging are the server's, `GET runs`); a change of the table's query is asked
 * for at once. Otherwise everything refreshes every second while the
 * panel is visible, every 15 s while it is hidden, and not at all while the browser tab is
 * hidden. When the server cannot be reached the poll backs off (up to 30 s) and the panel says
 * so at the top.
 *
 * The card's curve is the server's (`runs/ID/curves`): the whole run's mean, decimated there, so
 * a poll costs the run's new rows only, however long it has run.
 */
import { ReactWidget } from '@jupyterlab/ui-components';
import { Poll } from '@lumino/polling';
import { Message } from '@lumino/messaging';
import React from 'react';

import {
  ICurves,
  IRun,
  IRunsPage,
  IRunsQuery,
  IWorker,
  listClusters,
  listRuns,
  runCurves,
  runHealth,
  startCluster,
  stopCluster
} from './api';
import { errorText, Unreachable } from './request';
import { DEFAULT_COLUMNS, PAGE } from './runlist';
import { IOpener, IPanelState } from './state';
import { Sidebar } from './views';

const LIVE_MS = 250; // a live run's workers, while the panel is visible
const CURVE_MS = 500; // a live run's card curve
const VISIBLE_MS = 1000;
const HIDDEN_MS = 15000;
const MAX_BACKOFF_MS = 30000;
const CARD_POINTS = 200;
const COLUMNS_KEY = 'nbdist:run-columns'; // the table's columns, kept in the browser

export class SidebarPanel extends ReactWidget {
  constructor(opener: IOpener) {
    super();
    this._opener = opener;
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
        onOpen={run => this._opener.openRun(run)}
        onSelect={(ids, on) => this._select(ids, on)}
        onCompare={() => this._compare()}
        onQuery={change => this._query(change)}
        onColumns={columns => this._columns(columns)}
      />
    );
  }

  /** Poll fast only while it pays: a live run in a visible panel, and the server answering
   * (after an error the poll backs off from the 1 s pace); a long run's first read, at once. */
  private _pace(): void {
    const live = this._state.focus?.status === 'running' && !this._failing;
    const reading = this._state.curves !== null && !this._state.curves.complete;
    const interval = !this.isVisible ? HIDDEN_MS : live || reading ? LIVE_MS : VISIBLE_MS;
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

  /** Clusters, the runs table's page, and the focused run's workers and curve. */
  private async _refreshAll(): Promise<void> {
    this._lastFull = Date.now();
    const query = this._state.query;
    const [clusters, page, live] = await Promise.all([
      listClusters(),
      listRuns({ ...query, limit: PAGE }),
      listRuns({ status: 'running', limit: 1 })
    ]);
    const focus = live.runs[0] ?? (await this._latest(query, page));
    if (focus?.id !== this._focusId) {
      this._focusId = focus?.id ?? null;
      this._lastCurve = 0;
      this._patch({ curves: null, cardMetric: 'loss', workers: [] });
    }
    const [workers, curves] = focus ? await this._readFocus(focus, true) : [[], null];
    const ticked = this._state.selected.map(id => this._known.get(id));
    this._known = new Map(
      // what a comparison may need: the runs ticked, and those shown
      [...ticked, ...page.runs, focus].filter((r): r is IRun => !!r).map(r => [r.id, r])
    );
    this._patch({
      clusters: clusters.clusters,
      // a page of an older query (the table's was changed meanwhile) waits for the next
      ...(query === this._state.query ? { page } : {}),
      focus,
      workers,
      ...(curves ? { curves } : {}),
      loaded: true,
      unreachable: false,
      lastOk: Date.now()
    });
  }

  /** The latest run: the page's first when the table shows the latest runs, else asked. */
  private async _latest(query: IRunsQuery, page: IRunsPage): Promise<IRun | null> {
    const plain = !query.offset && !query.q && !query.status && !query.all;
    if (plain && (query.sort ?? 'time') === 'time' && query.order !== 'asc') {
      return page.runs[0] ?? null;
    }
    return (await listRuns({ limit: 1 })).runs[0] ?? null;
  }

  /** Only the live run's workers and curve (its status comes with the next full one). */
  private async _refreshLive(): Promise<void> {
    const focus = this._state.focus;
    if (focus === null || focus.id !== this._focusId) {
      return;
    }
    const [workers, curves] = await this._readFocus(focus, false);
    if (focus.id !== this._focusId) {
      return;
    }
    if (deadCount(workers) > deadCount(this._state.workers)) {
      this._lastFull = 0; // a rank died: its engine and the run's status follow at the next tick
    }
    this._patch({
      workers,
      ...(curves ? { curves } : {}),
      unreachable: false,
      lastOk: Date.now()
    });
  }

  /** The run's workers, and its card curve when due (null: not read this time). */
  private async _readFocus(run: IRun, full: boolean): Promise<[IWorker[], ICurves | null]> {
    const reading = this._state.curves !== null && !this._state.curves.complete;
    const settled = run.status !== 'running' && this._finalCurve === run.id && !reading;
    const due = !settled && (full || reading || Date.now() - this._lastCurve >= CURVE_MS);
    const [health, curves] = await Promise.all([
      runHealth(run.id),
      due ? runCurves(run.id, { points: CARD_POINTS, metrics: [this._state.cardMetric] }) : null
    ]);
    if (curves) {
      this._lastCurve = Date.now();
      this._finalCurve = run.status !== 'running' ? run.id : null; // read after its end
      if (!curves.names.includes(this._state.cardMetric) && curves.names.length) {
        this._patch({ cardMetric: curves.names[0] }); // no loss: the first metric reported
        this._lastCurve = 0;
        this._finalCurve = null;
      }
    }
    return [health.workers, curves && curves.run_id === this._focusId ? curves : null];
  }

  private _select(ids: number[], on: boolean): void {
    const kept = this._state.selected.filter(id => !ids.includes(id));
    this._patch({ selected: on ? [...kept, ...ids] : kept });
  }

  /** The runs table asks for another page, search, filter or sort: read it at once. */
  private _query(change: Partial<IRunsQuery>): void {
    this._patch({ query: { ...this._state.query, ...change } });
    this._lastFull = 0; // a full refresh, even while a live run is polled fast
    void this._poll.refresh();
  }

  private _columns(columns: string[]): void {
    this._patch({ columns });
    try {
      window.localStorage.setItem(COLUMNS_KEY, JSON.stringify(columns));
    } catch {
      // storage refused (a private window): the columns last as long as the page
    }
  }

  private _compare(): void {
    const runs = this._state.selected.map(id => this._known.get(id)).filter((r): r is IRun => !!r);
    if (runs.length >= 2) {
      this._opener.compare(runs);
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

  private _opener: IOpener;
  private _poll: Poll;
  private _focusId: number | null = null;
  private _lastFull = 0; // when clusters and runs were last read (ms)
  private _lastCurve = 0; // when the card's curve was last read (ms)
  private _finalCurve: number | null = null; // the ended run whose curve was read since its end
  private _failing = false; // the last refresh failed: no fast pace until one succeeds
  private _known = new Map<number, IRun>(); // runs shown or ticked, for a comparison
  private _state: IPanelState = {
    clusters: [],
    page: null,
    query: {},
    columns: savedColumns(),
    focus: null,
    curves: null,
    cardMetric: 'loss',
    workers: [],
    selected: [],
    loaded: false,
    unreachable: false,
    error: '',
    busy: false,
    lastOk: 0
  };
}

/** The table's columns as last chosen in this browser, else the default ones. */
function savedColumns(): string[] {
  try {
    const saved = JSON.parse(window.localStorage.getItem(COLUMNS_KEY) ?? 'null');
    if (Array.isArray(saved) && saved.every(c => typeof c === 'string')) {
      return saved;
    }
  } catch {
    // nothing kept, or not readable: the default
  }
  return DEFAULT_COLUMNS;
}

function deadCount(workers: IWorker[]): number {
  return workers.filter(w => w.state === 'dead').length;
}
