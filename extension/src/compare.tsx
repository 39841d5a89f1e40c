/**
 * Runs compared, as TensorBoard compares them: each run's mean of one metric, overlaid on one
 * chart, one colour per run, labelled by its id and name. The metric is picked from every metric
 * any of the runs reported; a run that lacks it says so in the legend.
 *
 * Read from `runs/ID/curves` (only the metric shown is sent); polled once a second while one of
 * the runs is live, and not at all once each has ended and been read to its end.
 */
import { ReactWidget } from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import { Poll } from '@lumino/polling';
import React from 'react';

import { getRun, ICurves, ILineData, IRun, runCurves } from './api';
import { ChartBox, SmoothingSlider } from './chartbox';
import { runLength, runTitle } from './describe';
import { fmtInt } from './format';
import { runColour, runLines } from './lines';
import { errorText } from './request';

const LIVE_MS = 1000;
const CATCH_UP_MS = 200;
const POINTS = 1000;

interface ICompareState {
  runs: IRun[];
  curves: Map<number, ICurves>;
  metric: string;
  smoothing: number;
  error: string;
}

export class CompareView extends ReactWidget {
  constructor(runs: IRun[]) {
    super();
    this.addClass('jp-nbdist-CompareView');
    this.title.label = `compare ${runs.map(r => `#${r.id}`).join(' ')}`;
    this.title.caption = `nbdist: runs ${runs.map(runTitle).join(', ')} compared`;
    this.title.closable = true;
    this._state = { runs, curves: new Map(), metric: '', smoothing: 0, error: '' };
    this._poll = new Poll({
      auto: true,
      factory: () => this._refresh(),
      frequency: { interval: LIVE_MS, backoff: true, max: 30000 },
      name: 'nbdist:compare',
      standby: 'when-hidden'
    });
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

  protected render(): JSX.Element {
    return (
      <ComparePage
        state={this._state}
        onMetric={metric => {
          this._patch({ metric });
          this._finished = false;
          void this._poll.refresh();
        }}
        onSmoothing={smoothing => this._patch({ smoothing })}
      />
    );
  }

  private async _refresh(): Promise<void> {
    if (this._finished) {
      return;
    }
    const metric = this._state.metric;
    try {
      const runs = await Promise.all(this._state.runs.map(r => getRun(r.id)));
      const answers = await Promise.all(
        runs.map(({ run }) =>
          runCurves(run.id, { points: POINTS, metrics: metric ? [metric] : ['loss'] })
        )
      );
      const curves = new Map(answers.map(c => [c.run_id, c]));
      const names = unionOfNames(answers);
      const chosen = metric && names.includes(metric) ? metric : pick(names);
      const behind = answers.some(c => !c.complete);
      const live = runs.some(({ run }) => run.status === 'running');
      this._finished = !behind && !live && chosen === metric;
      this._poll.frequency = {
        ...this._poll.frequency,
        interval: behind || chosen !== metric ? CATCH_UP_MS : LIVE_MS
      };
      this._patch({ runs: runs.map(r => r.run), curves, metric: chosen, error: '' });
    } catch (error) {
      this._patch({ error: errorText(error) });
      throw error;
    }
  }

  private _patch(part: Partial<ICompareState>): void {
    this._state = { ...this._state, ...part };
    this.update();
  }

  private _poll: Poll;
  private _finished = false;
  private _state: ICompareState;
}

/** Every metric any of the runs reported, in the order first met. */
function unionOfNames(answers: ICurves[]): string[] {
  const out: string[] = [];
  for (const c of answers) {
    for (const n of c.names) {
      if (!out.includes(n)) {
        out.push(n);
      }
    }
  }
  return out;
}

function pick(names: string[]): string {
  return names.includes('loss') ? 'loss' : (names[0] ?? '');
}

function ComparePage(props: {
  state: ICompareState;
  onMetric: (metric: string) => void;
  onSmoothing: (weight: number) => void;
}): JSX.Element {
  const { runs, curves, metric, smoothing, error } = props.state;
  const names = unionOfNames([...curves.values()]);
  const means = React.useMemo(() => {
    const out = new Map<number, ILineData>();
    for (const [id, c] of curves) {
      const m = c.metrics.find(m => m.name === metric);
      if (m && m.mean.x.length) {
        out.set(id, m.mean);
      }
    }
    return out;
  }, [curves, metric]);
  const lines = React.useMemo(() => runLines(runs, means, smoothing), [runs, means, smoothing]);
  return (
    <div className="jp-nbdist-RunView-body" data-metric={metric}>
      <header className="jp-nbdist-viewHead">
        <h1 className="jp-nbdist-viewTitle">{`${fmtInt(runs.length)} runs compared`}</h1>
      </header>
      {error && <div className="jp-nbdist-banner jp-nbdist-mod-warn">{error}</div>}
      <div className="jp-nbdist-sectionHead">
        <label className="jp-nbdist-metricPick">
          metric
          <select
            className="jp-mod-styled"
            value={metric}
            aria-label="metric to compare"
            onChange={e => props.onMetric(e.target.value)}
          >
            {names.map(n => (
              <option key={n} value={n}>
                {n}
              </option>
            ))}
          </select>
        </label>
        <SmoothingSlider value={smoothing} onChange={props.onSmoothing} />
      </div>
      <ul className="jp-nbdist-compareLegend">
        {runs.map((r, i) => (
          <li key={r.id} data-run-id={r.id} data-has-metric={String(means.has(r.id))}>
            <span className="jp-nbdist-swatch" style={{ background: runColour(i) }} />
            <span className="jp-nbdist-legendName">{runTitle(r)}</span>
            <span className="jp-nbdist-meta">
              {`${r.status} · ${runLength(r)}${means.has(r.id) || !metric ? '' : ` · no ${metric} in this run`}`}
            </span>
          </li>
        ))}
      </ul>
      {metric === '' ? (
        <p className="jp-nbdist-empty">
          {curves.size ? 'None of these runs reported a metric.' : 'Reading the runs…'}
        </p>
      ) : (
        <div className="jp-nbdist-compareChart">
          <ChartBox
            key={metric}
            name={metric}
            lines={lines}
            options={{
              title: `${metric}: mean over ranks, per run`,
              xLabel: 'step',
              height: 340
            }}
          />
        </div>
      )}
    </div>
  );
}
