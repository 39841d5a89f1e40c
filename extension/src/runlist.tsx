/**
 * The sidebar's list of past runs, and the selection that compares them.
 *
 * A click on a run opens it in the main area; its checkbox, or a ctrl/cmd-click, ticks it; a
 * shift-click ticks every run from the last one clicked. With two runs or more ticked, the bar
 * above the runs offers to compare them (their curves overlaid on any metric).
 */
import { Button } from '@jupyterlab/ui-components';
import React from 'react';

import { IRun } from './api';
import { lossText, runLength, runTitle, stepText } from './describe';
import { fmtInt } from './format';

export function RunList(props: {
  runs: IRun[];
  selected: number[];
  onOpen: (run: IRun) => void;
  onSelect: (runIds: number[], on: boolean) => void;
}): JSX.Element {
  const anchor = React.useRef<number | null>(null); // the run clicked last, for shift-click
  const click = (e: React.MouseEvent, r: IRun) => {
    if ((e.target as HTMLElement).closest('input')) {
      return; // the checkbox speaks for itself
    }
    const on = !props.selected.includes(r.id);
    if (e.shiftKey && anchor.current !== null) {
      const ids = props.runs.map(run => run.id);
      const [a, b] = [ids.indexOf(anchor.current), ids.indexOf(r.id)].sort((x, y) => x - y);
      if (a >= 0) {
        props.onSelect(ids.slice(a, b + 1), true);
        return;
      }
    }
    anchor.current = r.id;
    if (e.ctrlKey || e.metaKey || e.shiftKey) {
      props.onSelect([r.id], on);
    } else {
      props.onOpen(r);
    }
  };
  return (
    <ul className="jp-nbdist-runs">
      {props.runs.map(r => {
        const selected = props.selected.includes(r.id);
        return (
          <li
            key={r.id}
            className="jp-nbdist-pastRun"
            data-run-id={r.id}
            data-status={r.status}
            data-selected={String(selected)}
            title={`started ${new Date(r.started * 1000).toLocaleString()}: click to open, ctrl-click or tick to compare`}
            onClick={e => click(e, r)}
          >
            <div className="jp-nbdist-runHead">
              <input
                type="checkbox"
                className="jp-nbdist-select"
                checked={selected}
                aria-label={`select run ${r.id} to compare`}
                onChange={e => {
                  anchor.current = r.id;
                  props.onSelect([r.id], e.target.checked);
                }}
              />
              <span className={`jp-nbdist-dot jp-nbdist-run-${r.status}`} />
              <button
                type="button"
                className="jp-nbdist-runName jp-nbdist-runOpen"
                title={`open run ${r.id}`}
              >
                {runTitle(r)}
              </button>
              <span className="jp-nbdist-meta">{r.status}</span>
            </div>
            {r.error && <div className="jp-nbdist-runError">{r.error}</div>}
            <div className="jp-nbdist-meta jp-nbdist-runFacts">{facts(r)}</div>
          </li>
        );
      })}
    </ul>
  );
}

/** A past run's figures, each kept whole when the line wraps; missing ones left out. */
function facts(r: IRun): React.ReactNode[] {
  const parts = [
    r.step === null ? '' : `step ${stepText(r.step, null)}`,
    r.loss === null && !r.nonfinite ? '' : `loss ${lossText(r)}`,
    r.samples_per_s === null ? '' : `${fmtInt(r.samples_per_s)} samples/s`,
    runLength(r)
  ].filter(Boolean);
  return parts.map((p, i) => (
    <React.Fragment key={i}>
      {i ? ' · ' : ''}
      <span>{p}</span>
    </React.Fragment>
  ));
}

/** "2 runs selected: Compare · Clear", while runs are ticked. */
export function SelectionBar(props: {
  selected: number[];
  onCompare: () => void;
  onClear: () => void;
}): JSX.Element | null {
  const n = props.selected.length;
  if (n === 0) {
    return null;
  }
  return (
    <div className="jp-nbdist-selection" role="status">
      <span className="jp-nbdist-selectionText">
        {n === 1 ? '1 run selected: tick another to compare' : `${n} runs selected`}
      </span>
      <Button
        small
        className="jp-mod-styled jp-mod-accept jp-nbdist-compareButton"
        disabled={n < 2}
        title="Overlay the selected runs' curves on any metric"
        onClick={props.onCompare}
      >
        Compare
      </Button>
      <Button small minimal title="Untick every run" onClick={props.onClear}>
        Clear
      </Button>
    </div>
  );
}
