/**
 * One run, opened in JupyterLab's main area from the sidebar: its header (status, steps, length,
 * the error that ended it), a chart of every metric it reported (each rank and their mean, with
 * the chart's log toggle, hover readout and zoom, and a smoothing slider for all), its workers'
 * health over time, its events and its failures.
 *
 * Everything is read from the server's endpoints (the run store), so a run of an earlier kernel
 * opens as well as the live one. Past 8 ranks a metric's chart is its mean, the band of its ranks'
 * values (shaded) and its outlier ranks' own lines, named, its title saying so, as the board's. A live run's view polls once a second while it is open and
 * stops when the run has ended and been read to its end, or when the view is closed.
 */
import { ReactWidget } from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import { Poll } from '@lumino/polling';
import React from 'react';

import {
  getRun,
  ICurves,
  IEvent,
  IHealthHistory,
  IMetricCurves,
  IRun,
  IRunDetail,
  IWorker,
  runCurves,
  runEvents,
  runHealth,
  runHealthHistory
} from './api';
import { titleOf } from './boards/charts';
import { ILine } from './chart';
import { ChartBox, SmoothingSlider } from './chartbox';
import { lossText, runLength, runTitle, stepText } from './describe';
import { fmtInt } from './format';
import { metricLines } from './lines';
import { errorText } from './request';
import { EventsTable, Failures, HealthSection } from './runparts';
import { RANK_LINES, spreadLines } from './smoothing';

const LIVE_MS = 1000;
const CATCH_UP_MS = 200; // a long run's first read, in bounded pieces
const POINTS = 1000;
const HEALTH_POINTS = 600;

interface IRunViewState {
  run: IRunDetail | null;
  curves: ICurves | null;
  health: IHealthHistory | null;
  workers: IWorker[];
  events: IEvent[];
  /** How many events the run has (the latest 1,000 are read). */
  eventsTotal: number;
  error: string;
  smoothing: number;
}

export class RunView extends ReactWidget {
  constructor(run: IRun) {
    super();
    this._runId = run.id;
    this.addClass('jp-nbdist-RunView');
    this.title.label = `run ${runTitle(run)}`;
    this.title.caption = `nbdist run ${runTitle(run)}`;
    this.title.closable = true;
    this._poll = new Poll({
      auto: true,
      factory: () => this._refresh(),
      frequency: { interval: LIVE_MS, backoff: true, max: 30000 },
      name: `nbdist:run-${run.id}`,
      standby: 'when-hidden'
    });
  }

  get runId(): number {
    return this._runId;
  }

  dispose(): void {
    this._poll.dispose();
    super.dispose();
  }

  /** Closed, it is done with: its poll stops with it. */
  protected onCloseRequest(msg: Message): void {
    super.onCloseRequest(msg);
    this.dispose();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    if (!this._finished) {
      void this._poll.refresh();
    }
  }

  protected render(): JSX.Element {
    return (
      <RunPage
        state={this._state}
        onSmoothing={smoothing => this._patch({ smoothing })}
        onRefresh={() => {
          this._finished = false;
          void this._poll.refresh();
        }}
      />
    );
  }

  private async _refresh(): Promise<void> {
    if (this._finished || (!this.isVisible && this._state.run !== null)) {
      return; // read to its end; or out of sight (it reads again when shown)
    }
    const id = this._runId;
    try {
      const [run, curves, health, workers, events] = await Promise.all([
        getRun(id),
        runCurves(id, { points: POINTS, ranks: true }),
        runHealthHistory(id, HEALTH_POINTS),
        runHealth(id),
        runEvents(id)
      ]);
      const behind = !curves.complete || !health.complete;
      this._finished = run.run.status !== 'running' && !behind;
      this._poll.frequency = {
        ...this._poll.frequency,
        interval: behind ? CATCH_UP_MS : LIVE_MS
      };
      this._patch({
        run: run.run,
        curves,
        health,
        workers: workers.workers,
        events: events.events,
        eventsTotal: events.total,
        error: ''
      });
    } catch (error) {
      this._patch({ error: errorText(error) });
      throw error; // the poll backs off
    }
  }

  private _patch(part: Partial<IRunViewState>): void {
    this._state = { ...this._state, ...part };
    this.update();
  }

  private _runId: number;
  private _poll: Poll;
  private _finished = false;
  private _state: IRunViewState = {
    run: null,
    curves: null,
    health: null,
    workers: [],
    events: [],
    eventsTotal: 0,
    error: '',
    smoothing: 0
  };
}

function RunPage(props: {
  state: IRunViewState;
  onSmoothing: (weight: number) => void;
  onRefresh: () => void;
}): JSX.Element {
  const { run, curves, error } = props.state;
  if (run === null) {
    return (
      <div className="jp-nbdist-RunView-body">
        <p className="jp-nbdist-empty">{error ? `Cannot read the run: ${error}` : 'Loading…'}</p>
      </div>
    );
  }
  const step = Math.max(run.step ?? -1, curves?.done ?? -1);
  return (
    <div className="jp-nbdist-RunView-body" data-run-id={run.id} data-status={run.status}>
      <header className="jp-nbdist-viewHead">
        <span className={`jp-nbdist-dot jp-nbdist-run-${run.status}`} />
        <h1 className="jp-nbdist-viewTitle">{`Run ${runTitle(run)}`}</h1>
        <span className="jp-nbdist-badge" data-testid="nbdist-view-status">
          {run.status}
        </span>
      </header>
      {run.error && (
        <div className="jp-nbdist-banner jp-nbdist-mod-error" data-testid="nbdist-view-error">
          {run.error}
        </div>
      )}
      {error && <div className="jp-nbdist-banner jp-nbdist-mod-warn">{error}</div>}
      <dl className="jp-nbdist-facts">
        <Fact label="steps" value={stepText(step < 0 ? null : step, run.total)} />
        <Fact label="loss" value={lossText(run)} />
        <Fact label="samples/s" value={fmtInt(run.samples_per_s)} />
        <Fact label="length" value={runLength(run)} />
        <Fact label="started" value={new Date(run.started * 1000).toLocaleString()} />
        <Fact label="ranks" value={fmtInt(run.world_size)} />
        <Fact label="cluster" value={run.cluster_id || '–'} />
      </dl>
      <Metrics
        runId={run.id}
        curves={curves}
        running={run.status === 'running'}
        smoothing={props.state.smoothing}
        onSmoothing={props.onSmoothing}
      />
      <HealthSection run={run} history={props.state.health} workers={props.state.workers} />
      <section className="jp-nbdist-viewSection">
        <h2>Events</h2>
        <EventsTable
          events={props.state.events}
          total={props.state.eventsTotal}
          started={run.started}
        />
      </section>
      <Failures run={run} />
      {run.source && (
        <details className="jp-nbdist-viewSection">
          <summary>Source of the cell</summary>
          <pre className="jp-nbdist-source">{run.source}</pre>
        </details>
      )}
    </div>
  );
}

function Fact(props: { label: string; value: string }): JSX.Element {
  return (
    <div className="jp-nbdist-fact">
      <dt>{props.label}</dt>
      <dd>{props.value}</dd>
    </div>
  );
}

/** Every metric's chart, in the order first reported; the smoothing slider applies to all. */
function Metrics(props: {
  runId: number;
  curves: ICurves | null;
  running: boolean;
  smoothing: number;
  onSmoothing: (weight: number) => void;
}): JSX.Element {
  const { curves, smoothing } = props;
  const charts = React.useMemo(
    () => (curves?.metrics ?? []).map(m => ({ m, ...drawn(m, smoothing) })),
    [curves, smoothing]
  );
  let empty = '';
  if (curves === null) {
    empty = 'Reading the metrics…';
  } else if (!curves.complete) {
    empty = `Reading the run: ${fmtInt(curves.rows)} reports so far…`;
  } else if (!curves.names.length) {
    empty = props.running
      ? 'Waiting for reports: nbdist.report(step=..., loss=..., acc=...) in the cell.'
      : 'This run reported no metrics (it never called nbdist.report()).';
  }
  return (
    <section className="jp-nbdist-viewSection">
      <div className="jp-nbdist-sectionHead">
        <h2>Metrics</h2>
        <SmoothingSlider value={smoothing} onChange={props.onSmoothing} />
      </div>
      {curves && curves.dropped > 0 && (
        <p className="jp-nbdist-hint">{`${fmtInt(curves.dropped)} more metrics are kept in the run store but not charted (at most 50 are).`}</p>
      )}
      {empty && charts.length === 0 ? (
        <p className="jp-nbdist-empty">{empty}</p>
      ) : (
        <div className="jp-nbdist-chartGrid" data-charts={charts.length}>
          {charts.map(({ m, lines, title }) => (
            <ChartBox
              key={m.name}
              name={m.name}
              lines={lines}
              options={{
                title,
                xLabel: 'step',
                height: 170,
                sync: `nbdist-run-${props.runId}`
              }}
            />
          ))}
        </div>
      )}
    </section>
  );
}

/** A metric's lines and the title that says what they are: past 8 ranks (the server sends a
 * band) its mean, band and outliers; else each rank's line and their mean. */
function drawn(m: IMetricCurves, smoothing: number): { lines: ILine[]; title: string } {
  if (m.outliers === undefined) {
    const ranks = m.ranks.length;
    const title = titleOf(m.name, ranks, ranks > RANK_LINES ? 'mean' : 'ranks');
    return { lines: metricLines(m, smoothing), title };
  }
  const none = { x: [], y: [] };
  const band = m.band ?? { lo: none, hi: none, ranks: 0 };
  return {
    lines: spreadLines(m.mean, band.lo, band.hi, m.ranks, smoothing),
    title: titleOf(m.name, band.ranks, 'band', m.outliers)
  };
}
