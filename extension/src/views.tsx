/**
 * The panel's React views: pure functions of the panel state. The run card is card.tsx; the
 * runs table (search, filter, sort, columns, pages), with its selection for comparing, is
 * runlist.tsx.
 *
 * Strings that come from engines or the run store (host names, run names, errors) are React text
 * children or attributes, which React escapes: nothing here sets HTML.
 */
import { Button, refreshIcon } from '@jupyterlab/ui-components';
import React from 'react';

import { ICluster, IRun, IRunsQuery } from './api';
import { RunCard } from './card';
import { ago } from './describe';
import { RunTable, SelectionBar } from './runlist';
import type { IPanelState } from './state';

export interface ISidebarProps {
  state: IPanelState;
  onStart: (n: number) => void;
  onStop: (clusterId: string) => void;
  onRefresh: () => void;
  onOpen: (run: IRun) => void;
  /** Tick or untick runs (a click on a checkbox; ctrl/shift-click on a row). */
  onSelect: (runIds: number[], on: boolean) => void;
  onCompare: () => void;
  /** Another page, search, filter or sort of the runs table. */
  onQuery: (change: Partial<IRunsQuery>) => void;
  onColumns: (columns: string[]) => void;
}

export function Sidebar(props: ISidebarProps): JSX.Element {
  const { state } = props;
  const live = state.focus?.status === 'running';
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
      <SelectionBar
        selected={state.selected}
        onCompare={props.onCompare}
        onClear={() => props.onSelect(state.selected, false)}
      />
      <Section title={live ? 'Live run' : 'Latest run'}>
        {state.focus ? (
          <RunCard
            run={state.focus}
            curves={state.curves}
            metric={state.cardMetric}
            workers={state.workers}
            selected={state.selected.includes(state.focus.id)}
            onOpen={props.onOpen}
            onSelect={(run, on) => props.onSelect([run.id], on)}
          />
        ) : (
          <Empty>
            No run yet: run a <code>%%distributed</code> cell; it shows here, with its progress when
            it calls <code>nbdist.report(step=..., loss=...)</code>.
          </Empty>
        )}
      </Section>
      <Section title={state.page ? `Runs (${state.page.total})` : 'Runs'}>
        <RunTable
          page={state.page}
          query={state.query}
          columns={state.columns}
          selected={state.selected}
          onQuery={props.onQuery}
          onColumns={props.onColumns}
          onOpen={props.onOpen}
          onSelect={props.onSelect}
        />
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

export function Empty(props: { children?: React.ReactNode }): JSX.Element {
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
