/**
 * The sidebar's run card (the live run, or else the latest): what state it is in, how far it
 * got, its curve over the whole run, each rank's tile, and the error that ended it.
 *
 * It tells the truth about the end of a run: a failed run names its failing rank and error
 * (`run.error`, "rank 1: KeyError: 'b'"), each rank's tile shows how it ended (failed, stopped
 * by the failure, done, dead) in a colour of its own, a finished run without reports says so,
 * and a run that is no longer running never shows a live tile ("ok") again.
 */
import { Button } from '@jupyterlab/ui-components';
import React from 'react';

import { ICurves, IRun, IWorker } from './api';
import { lossText, runLength, runTitle, stepText } from './describe';
import { fmt, fmtInt } from './format';
import { Sparkline } from './sparkline';
import { WorkerGrid } from './workers';

export interface IRunCardProps {
  run: IRun;
  curves: ICurves | null;
  metric: string;
  workers: IWorker[];
  selected: boolean;
  onOpen: (run: IRun) => void;
  onSelect: (run: IRun, on: boolean) => void;
}

export function RunCard(props: IRunCardProps): JSX.Element {
  const r = props.run;
  const curves = props.curves && props.curves.run_id === r.id ? props.curves : null;
  // The store's step is written once a second; the curves' rows are fresher while it runs.
  const step = Math.max(r.step ?? -1, curves?.done ?? -1);
  const line = curves?.metrics.find(m => m.name === props.metric)?.mean ?? null;
  return (
    <div className="jp-nbdist-run" data-run-id={r.id} data-status={r.status}>
      <div className="jp-nbdist-runHead">
        <input
          type="checkbox"
          className="jp-nbdist-select"
          checked={props.selected}
          aria-label={`select run ${r.id} to compare`}
          onChange={e => props.onSelect(r, e.target.checked)}
        />
        <span className={`jp-nbdist-dot jp-nbdist-run-${r.status}`} />
        <span className="jp-nbdist-runName" title={runTitle(r)}>
          {runTitle(r)}
        </span>
        <span className="jp-nbdist-meta">{r.status}</span>
      </div>
      {r.error && (
        <div className="jp-nbdist-runError" data-testid="nbdist-run-error" title={r.error}>
          {r.error}
        </div>
      )}
      <div className="jp-nbdist-figures">
        <Figure
          label="step"
          testid="nbdist-step"
          value={stepText(step < 0 ? null : step, r.total)}
        />
        <Figure label="loss" testid="nbdist-loss" value={lossText(r)} />
        <Figure label="samples/s" testid="nbdist-rate" value={fmtInt(r.samples_per_s)} />
        <Figure label="time" testid="nbdist-time" value={runLength(r)} />
      </div>
      <Sparkline line={line} name={props.metric} empty={emptyText(r, curves)} />
      <WorkerGrid workers={props.workers} run={r} />
      <div className="jp-nbdist-cardActions">
        <Button
          small
          className="jp-mod-styled jp-nbdist-openButton"
          title="Open this run's charts, health and events in the main area"
          onClick={() => props.onOpen(r)}
        >
          Open run
        </Button>
      </div>
    </div>
  );
}

/** What the card's curve says when it has no line to draw. */
function emptyText(r: IRun, curves: ICurves | null): string {
  if (curves === null) {
    return r.status === 'running' ? 'waiting for reports' : 'reading the run…';
  }
  if (!curves.complete) {
    return `reading the run: ${fmtInt(curves.rows)} reports so far…`;
  }
  if (curves.names.length === 0) {
    return r.status === 'running'
      ? 'waiting for reports: nbdist.report(step=..., loss=...)'
      : 'no reports: this run never called nbdist.report()';
  }
  const only = curves.metrics[0]?.mean;
  if (only && only.y.length === 1) {
    return `one report only: ${curves.metrics[0].name} ${fmt(only.y[0])} at step ${fmtInt(only.x[0])}`;
  }
  return r.status === 'running' ? 'waiting for a second report' : 'not enough reports to draw';
}

function Figure(props: { label: string; value: string; testid?: string }): JSX.Element {
  return (
    <div className="jp-nbdist-figure">
      <div className="jp-nbdist-figureValue" data-testid={props.testid} title={props.value}>
        {props.value}
      </div>
      <div className="jp-nbdist-figureLabel">{props.label}</div>
    </div>
  );
}
