/**
 * The lower parts of a run's view: its workers' health over time (each measure a chart, each
 * rank a line; each rank's state changes), its events, and its failures in full.
 */
import React from 'react';

import { IEvent, IFailure, IHealthHistory, IRunDetail, IWorker } from './api';
import { WorkerGrid } from './workers';
import { ILine } from './chart';
import { ChartBox } from './chartbox';
import { fmtDuration, fmtInt, MISSING } from './format';
import { scaled } from './lines';
import { PALETTE, RANK_LINES } from './smoothing';

const MIB = 1 / (1024 * 1024);

/** The measures charted, in order: their title and the factor their values are shown at. */
const MEASURES: [string, string, number][] = [
  ['cpu', 'CPU, % of one core', 1],
  ['rss', 'memory (RSS), MiB', MIB],
  ['step_time', 'seconds per step', 1],
  ['comm_share', 'time in collectives, % of the step', 100],
  ['data_share', 'waiting for data, % of the step', 100],
  ['gpu_util', 'GPU utilisation, %', 1],
  ['gpu_mem', 'GPU memory, MiB', MIB]
];

export function HealthSection(props: {
  run: IRunDetail;
  history: IHealthHistory | null;
  workers: IWorker[];
}): JSX.Element {
  const { history } = props;
  const charts = React.useMemo(() => {
    const ranks = history?.ranks ?? [];
    const out: { name: string; title: string; lines: ILine[] }[] = [];
    for (const [name, title, by] of MEASURES) {
      const lines: ILine[] = [];
      ranks.slice(0, RANK_LINES).forEach((r, i) => {
        const data = r.measures[name];
        if (data && data.x.length) {
          const d = scaled(data, by);
          lines.push({ label: `rank ${r.rank}`, x: d.x, y: d.y, colour: PALETTE[i % 10] });
        }
      });
      if (lines.length) {
        out.push({ name, title, lines });
      }
    }
    return out;
  }, [history]);
  return (
    <section className="jp-nbdist-viewSection">
      <h2>Workers</h2>
      <WorkerGrid workers={props.workers} run={props.run} />
      {history && history.ranks.some(r => r.states.length) && (
        <ul className="jp-nbdist-stateChanges">
          {history.ranks.map(r => (
            <li key={r.rank} data-rank={r.rank}>
              <span className="jp-nbdist-stateRank">{`rank ${r.rank}`}</span>
              {r.states.map(([t, state], i) => (
                <span key={i} className="jp-nbdist-stateChange">
                  <span className={`jp-nbdist-dot jp-nbdist-state-${state}`} />
                  {`${state} at ${fmtDuration(t)}`}
                </span>
              ))}
            </li>
          ))}
        </ul>
      )}
      {charts.length === 0 ? (
        <p className="jp-nbdist-empty">
          {history === null ? 'Reading the health history…' : 'No health was recorded over time.'}
        </p>
      ) : (
        <div className="jp-nbdist-chartGrid jp-nbdist-healthGrid">
          {charts.map(c => (
            <ChartBox
              key={c.name}
              name={c.name}
              lines={c.lines}
              linear
              options={{
                title: c.title,
                xLabel: 'seconds',
                height: 130,
                sync: `nbdist-health-${props.run.id}`,
                zeroBased: true
              }}
            />
          ))}
        </div>
      )}
    </section>
  );
}

/**
 * The run's events, oldest first: when (since the start), whose, what; the latest of them when
 * the run has more than are read (`total`), and a line that says so.
 */
export function EventsTable(props: {
  events: IEvent[];
  total: number;
  started: number;
}): JSX.Element {
  if (props.events.length === 0) {
    return <p className="jp-nbdist-empty">No events.</p>;
  }
  const earlier = props.total - props.events.length;
  return (
    <div className="jp-nbdist-tableBox">
      {earlier > 0 && (
        <p className="jp-nbdist-hint" data-testid="nbdist-events-earlier">
          {`The latest ${fmtInt(props.events.length)} of ${fmtInt(props.total)} events (${fmtInt(earlier)} earlier ones are in the run store).`}
        </p>
      )}
      <table className="jp-nbdist-events">
        <thead>
          <tr>
            <th>after</th>
            <th>rank</th>
            <th>event</th>
            <th>message</th>
          </tr>
        </thead>
        <tbody>
          {props.events.map(e => (
            <tr key={e.id} data-kind={e.kind}>
              <td>{fmtDuration(e.time - props.started)}</td>
              <td>{e.rank === null ? MISSING : String(e.rank)}</td>
              <td>{e.kind}</td>
              <td className="jp-nbdist-eventMessage">{e.message}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

/** Each rank's failure in full (the card and the header show the cause's first line). */
export function Failures(props: { run: IRunDetail }): JSX.Element | null {
  // the cause first (the rank the run's error names), the ranks stopped by it last
  const cause = /^rank (\d+):/.exec(props.run.error)?.[1];
  const order = (f: IFailure) => (String(f.rank) === cause ? 0 : f.kind === 'interrupted' ? 2 : 1);
  const failures = [...(props.run.failures ?? [])].sort(
    (a, b) => order(a) - order(b) || a.rank - b.rank
  );
  if (failures.length === 0) {
    return null;
  }
  return (
    <section className="jp-nbdist-viewSection">
      <h2>Errors</h2>
      {failures.map((f, i) => (
        <div key={i} className="jp-nbdist-failure" data-rank={f.rank} data-kind={f.kind}>
          <div className="jp-nbdist-failureHead">{`rank ${f.rank} · ${f.kind}`}</div>
          <pre className="jp-nbdist-error">{f.summary}</pre>
        </div>
      ))}
    </section>
  );
}
