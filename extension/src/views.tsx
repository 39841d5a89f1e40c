/**
 * The panel's React views: pure functions of the panel state.
 *
 * Strings that come from engines or the run store (host names, run names, errors) are React text
 * children or attributes, which React escapes: nothing here sets HTML.
 */
import { Button, refreshIcon } from '@jupyterlab/ui-components';
import React from 'react';

import { ICluster, IRun, IWorker } from './api';
import type { IPanelState } from './state';

const STATES = ['ok', 'slow', 'silent', 'dead'];

interface ISidebarProps {
  state: IPanelState;
  onStart: (n: number) => void;
  onStop: (clusterId: string) => void;
  onRefresh: () => void;
}

export function Sidebar(props: ISidebarProps): JSX.Element {
  const { state } = props;
  const live = state.focus?.status === 'running';
  const past = state.runs.filter(r => r.id !== state.focus?.id);
  return (
    <div className="jp-nbdist-body">
      <div className="jp-nbdist-header">
        <h2 className="jp-nbdist-title">nbdist</h2>
        <Button minimal small title="Refresh now" onClick={props.onRefresh}>
          <refreshIcon.react tag="span" />
        </Button>
      </div>
      {state.unreachable && (
        <div className="jp-nbdist-banner jp-nbdist-mod-error" role="alert">
          Cannot reach the Jupyter server. Retrying, less often while it stays down
          {state.lastOk ? ` (last update ${ago(state.lastOk / 1000)})` : ''}.
        </div>
      )}
      {state.error && (
        <div className="jp-nbdist-banner jp-nbdist-mod-warn" role="status">
          {state.error}
        </div>
      )}
      <Section title="Clusters">
        <StartForm busy={state.busy} onStart={props.onStart} />
        {!state.loaded ? (
          <Empty>Loading…</Empty>
        ) : state.clusters.length === 0 ? (
          <Empty>
            No cluster yet: start one here, or in a notebook with <code>%nbdist start -n 2</code>.
          </Empty>
        ) : (
          state.clusters.map(c => (
            <ClusterRow
              key={c.cluster_id ?? `pid-${c.pid}`}
              cluster={c}
              busy={state.busy}
              onStop={props.onStop}
            />
          ))
        )}
      </Section>
      <Section title={live ? 'Live run' : 'Latest run'}>
        {state.focus ? (
          <RunDetail run={state.focus} curve={state.curve} workers={state.workers} />
        ) : (
          <Empty>
            No run yet: run a <code>%%distributed</code> cell; it shows here, with its progress when
            it calls <code>nbdist.report(step=..., loss=...)</code>.
          </Empty>
        )}
      </Section>
      <Section title="Past runs">
        {past.length === 0 ? <Empty>No past runs.</Empty> : <RunList runs={past} />}
      </Section>
    </div>
  );
}

function Section(props: { title: string; children?: React.ReactNode }): JSX.Element {
  return (
    <section className="jp-nbdist-section">
      <h3 className="jp-nbdist-sectionTitle">{props.title}</h3>
      {props.children}
    </section>
  );
}

function Empty(props: { children?: React.ReactNode }): JSX.Element {
  return <p className="jp-nbdist-empty">{props.children}</p>;
}

function StartForm(props: { busy: boolean; onStart: (n: number) => void }): JSX.Element {
  const [n, setN] = React.useState('2');
  const submit = (e: React.FormEvent) => {
    e.preventDefault();
    props.onStart(Number(n));
  };
  return (
    <form className="jp-nbdist-start" onSubmit={submit}>
      <label>
        Engines
        <input
          className="jp-mod-styled jp-nbdist-count"
          type="number"
          min={1}
          step={1}
          value={n}
          aria-label="number of engines"
          onChange={e => setN(e.target.value)}
        />
      </label>
      <Button
        type="submit"
        small
        disabled={props.busy}
        className="jp-mod-styled jp-mod-accept jp-nbdist-startButton"
        title="Start a local cluster of this many engines"
      >
        Start cluster
      </Button>
    </form>
  );
}

function ClusterRow(props: {
  cluster: ICluster;
  busy: boolean;
  onStop: (id: string) => void;
}): JSX.Element {
  const c = props.cluster;
  const alive = c.engines.filter(e => e.alive).length;
  const canStop = c.owner === 'sidebar' && c.cluster_id !== null && c.state === 'running';
  return (
    <div className="jp-nbdist-cluster" data-state={c.state} data-cluster-id={c.cluster_id ?? ''}>
      <div className="jp-nbdist-clusterHead">
        <span className={`jp-nbdist-dot jp-nbdist-state-${c.state}`} />
        <span className="jp-nbdist-clusterId">{c.cluster_id ?? `starting (pid ${c.pid})`}</span>
        {canStop && (
          <Button
            small
            minimal
            disabled={props.busy}
            className="jp-nbdist-stopButton"
            title="Stop this cluster and its engines"
            onClick={() => props.onStop(c.cluster_id as string)}
          >
            Stop
          </Button>
        )}
      </div>
      <div className="jp-nbdist-meta">
        {c.state}
        {c.engines.length > 0 && ` · ${alive}/${c.engines.length} engines alive`}
        {c.backend && ` · ${c.backend}`}
        {c.started && ` · started ${ago(c.started)}`}
        {c.owner === 'kernel' && ' · owned by a notebook kernel'}
      </div>
      {c.job && (
        <div className="jp-nbdist-job" data-job-state={c.job.state}>
          {c.job.line}
        </div>
      )}
      {c.error && <pre className="jp-nbdist-error">{c.error}</pre>}
      {c.engines.length > 0 && (
        <ul className="jp-nbdist-engines">
          {c.engines.map(e => (
            <li key={e.pid} className="jp-nbdist-engine" data-alive={String(e.alive)}>
              <span className={`jp-nbdist-dot jp-nbdist-state-${e.alive ? 'ok' : 'dead'}`} />
              {e.rank !== null ? `rank ${e.rank} · ` : ''}pid {e.pid}
              {e.alive ? '' : ' · gone'}
            </li>
          ))}
        </ul>
      )}
      {c.owner === 'sidebar' && c.state === 'running' && (
        <p className="jp-nbdist-hint">
          Use it from a notebook: <code>%nbdist attach {c.cluster_id}</code>
        </p>
      )}
    </div>
  );
}

function RunDetail(props: {
  run: IRun;
  curve: { step: number; loss: number }[];
  workers: IWorker[];
}): JSX.Element {
  const r = props.run;
  return (
    <div className="jp-nbdist-run" data-run-id={r.id} data-status={r.status}>
      <div className="jp-nbdist-runHead">
        <span className={`jp-nbdist-dot jp-nbdist-run-${r.status}`} />
        <span className="jp-nbdist-runName">{runTitle(r)}</span>
        <span className="jp-nbdist-meta">{r.status}</span>
      </div>
      <div className="jp-nbdist-figures">
        <Figure
          label="step"
          testid="nbdist-step"
          value={r.step === null ? '–' : `${r.step}${r.total ? ` / ${r.total}` : ''}`}
        />
        <Figure label="loss" testid="nbdist-loss" value={lossText(r)} />
        <Figure label="samples/s" testid="nbdist-rate" value={num(r.samples_per_s)} />
        <Figure label="time" value={duration(r.started, r.ended ?? r.updated)} />
      </div>
      <LossCurve points={props.curve} />
      <WorkerGrid workers={props.workers} worldSize={r.world_size} />
    </div>
  );
}

function Figure(props: { label: string; value: string; testid?: string }): JSX.Element {
  return (
    <div className="jp-nbdist-figure">
      <div className="jp-nbdist-figureValue" data-testid={props.testid}>
        {props.value}
      </div>
      <div className="jp-nbdist-figureLabel">{props.label}</div>
    </div>
  );
}

/** A small live curve of the loss against the step (rank 0's reports). */
export function LossCurve(props: { points: { step: number; loss: number }[] }): JSX.Element {
  const pts = props.points;
  if (pts.length < 2) {
    return (
      <div className="jp-nbdist-curve jp-nbdist-curveEmpty">loss curve: waiting for reports</div>
    );
  }
  const W = 200;
  const H = 48;
  const steps = pts.map(p => p.step);
  const losses = pts.map(p => p.loss);
  const [x0, x1] = [Math.min(...steps), Math.max(...steps)];
  const [y0, y1] = [Math.min(...losses), Math.max(...losses)];
  const sx = (x: number) => (x1 === x0 ? W / 2 : ((x - x0) / (x1 - x0)) * W);
  const sy = (y: number) => (y1 === y0 ? H / 2 : H - 2 - ((y - y0) / (y1 - y0)) * (H - 4));
  const line = pts.map(p => `${sx(p.step).toFixed(1)},${sy(p.loss).toFixed(1)}`).join(' ');
  return (
    <div className="jp-nbdist-curve">
      <svg
        viewBox={`0 0 ${W} ${H}`}
        preserveAspectRatio="none"
        role="img"
        aria-label={`loss from ${num(losses[0])} to ${num(losses[losses.length - 1])}`}
      >
        <polyline points={line} fill="none" vectorEffect="non-scaling-stroke" />
      </svg>
      <div className="jp-nbdist-curveAxis">
        <span>{num(y1)}</span>
        <span>{num(y0)}</span>
      </div>
    </div>
  );
}

function WorkerGrid(props: { workers: IWorker[]; worldSize: number }): JSX.Element {
  if (props.workers.length === 0) {
    return <Empty>No worker health yet.</Empty>;
  }
  return (
    <div>
      <div className="jp-nbdist-workers" role="list" aria-label="workers">
        {props.workers.map(w => (
          <div
            key={w.rank}
            role="listitem"
            data-rank={w.rank}
            data-state={w.state}
            className={`jp-nbdist-worker jp-nbdist-state-${STATES.includes(w.state) ? w.state : 'unknown'}`}
            title={workerTitle(w)}
          >
            <span className="jp-nbdist-workerRank">{w.rank}</span>
            <span className="jp-nbdist-workerState">{w.state}</span>
          </div>
        ))}
      </div>
      <div className="jp-nbdist-legend">
        {STATES.map(s => (
          <span key={s}>
            <span className={`jp-nbdist-dot jp-nbdist-state-${s}`} />
            {s}
          </span>
        ))}
      </div>
    </div>
  );
}

function RunList(props: { runs: IRun[] }): JSX.Element {
  return (
    <ul className="jp-nbdist-runs">
      {props.runs.map(r => (
        <li
          key={r.id}
          className="jp-nbdist-pastRun"
          data-run-id={r.id}
          data-status={r.status}
          title={`started ${new Date(r.started * 1000).toLocaleString()}`}
        >
          <div className="jp-nbdist-runHead">
            <span className={`jp-nbdist-dot jp-nbdist-run-${r.status}`} />
            <span className="jp-nbdist-runName">{runTitle(r)}</span>
            <span className="jp-nbdist-meta">{r.status}</span>
          </div>
          <div className="jp-nbdist-meta">
            {`step ${r.step ?? '–'} · loss ${lossText(r)} · ${num(r.samples_per_s)} samples/s · `}
            {duration(r.started, r.ended ?? r.updated)}
          </div>
        </li>
      ))}
    </ul>
  );
}

function runTitle(r: IRun): string {
  const name = r.label || r.name;
  return name ? `#${r.id} ${name}` : `#${r.id}`;
}

function lossText(r: IRun): string {
  return r.nonfinite ? r.nonfinite : num(r.loss);
}

function workerTitle(w: IWorker): string {
  const parts = [`rank ${w.rank}`, w.host ? `on ${w.host}` : '', w.state];
  if (w.cpu !== null) {
    parts.push(`cpu ${Math.round(w.cpu)}%`);
  }
  if (w.step_time !== null) {
    parts.push(`step ${num(w.step_time)} s`);
  }
  if (w.last_report_age !== null) {
    parts.push(`last report ${num(w.last_report_age)} s ago`);
  }
  return parts.filter(Boolean).join(' · ');
}

/** A number in at most 4 significant digits; '–' when missing. */
export function num(x: number | null | undefined): string {
  if (x === null || x === undefined || !Number.isFinite(x)) {
    return '–';
  }
  const a = Math.abs(x);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) {
    return x.toExponential(2);
  }
  return String(Number(x.toPrecision(4)));
}

function duration(start: number, end: number): string {
  const s = Math.max(0, end - start);
  if (s < 60) {
    return `${s.toFixed(1)} s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  }
  return `${(s / 3600).toFixed(1)} h`;
}

function ago(epochSeconds: number): string {
  const s = Date.now() / 1000 - epochSeconds;
  if (s < 5) {
    return 'just now';
  }
  if (s < 90) {
    return `${Math.round(s)} s ago`;
  }
  if (s < 5400) {
    return `${Math.round(s / 60)} min ago`;
  }
  return new Date(epochSeconds * 1000).toLocaleString();
}
