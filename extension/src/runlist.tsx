/**
 * The sidebar's runs table, as a W&B project's runs table: every run, a page at a time, found by
 * a part of its name, filtered by status, sorted by any summary metric (or time, duration,
 * name, status, step), with the columns chosen; ticked runs are compared.
 *
 * A click on a run opens it in the main area; its checkbox, or a ctrl/cmd-click, ticks it; a
 * shift-click ticks every run from the last one clicked. With two runs or more ticked (on any
 * page), the bar above the runs offers to compare them. Only the page in view is polled.
 */
import { Button } from '@jupyterlab/ui-components';
import React from 'react';

import { IRun, IRunsPage, IRunsQuery, RunStatus } from './api';
import { lossText, runLengthShort, stepText } from './describe';
import { fmt, fmtInt, MISSING } from './format';

/** Runs on a page of the sidebar's table. */
export const PAGE = 20;
/** Columns besides the name, by key: a field's, or a metric's (its last mean). */
const FIELD_COLUMNS: Record<string, string> = {
  status: 'status',
  step: 'step',
  duration: 'time',
  started: 'started',
  ranks: 'ranks'
};
/** The columns shown until others are chosen. */
export const DEFAULT_COLUMNS = ['step', 'loss', 'duration'];
const STATUSES: RunStatus[] = ['running', 'ok', 'failed', 'interrupted', 'stopped', 'lost'];
const FIELD_SORTS: [string, string][] = [
  ['time', 'newest'],
  ['duration', 'duration'],
  ['name', 'name'],
  ['status', 'status'],
  ['step', 'step']
];

export interface IRunTableProps {
  page: IRunsPage | null;
  query: IRunsQuery;
  columns: string[];
  selected: number[];
  onQuery: (change: Partial<IRunsQuery>) => void;
  onColumns: (columns: string[]) => void;
  onOpen: (run: IRun) => void;
  onSelect: (runIds: number[], on: boolean) => void;
}

/** The toolbar, the table of the page in view, and the pager. */
export function RunTable(props: IRunTableProps): JSX.Element {
  const { page, query } = props;
  const metrics = page?.metrics ?? [];
  return (
    <div className="jp-nbdist-runTableBox">
      <RunFilters {...props} metrics={metrics} />
      {page === null ? (
        <p className="jp-nbdist-empty">Loading…</p>
      ) : page.runs.length === 0 ? (
        <p className="jp-nbdist-empty" data-testid="nbdist-runs-none">
          {filtered(query) ? 'No run matches.' : 'No runs yet.'}
          {query.all ? '' : ' Cells that report nothing, unnamed, are listed with "all cells".'}
        </p>
      ) : (
        <RunRows {...props} page={page} />
      )}
      {page !== null && page.total > 0 && <Pager page={page} onQuery={props.onQuery} />}
    </div>
  );
}

function filtered(q: IRunsQuery): boolean {
  return Boolean(q.q || q.status);
}

function RunFilters(props: IRunTableProps & { metrics: string[] }): JSX.Element {
  const { query, metrics } = props;
  const sort = query.sort || 'time';
  const sorts = [
    ...FIELD_SORTS,
    ...metrics.flatMap(m => [
      [m, `${m}: last`],
      [`min:${m}`, `${m}: min`],
      [`max:${m}`, `${m}: max`]
    ])
  ] as [string, string][];
  if (!sorts.some(([key]) => key === sort)) {
    sorts.push([sort, sort]);
  }
  const down = query.order ? query.order === 'desc' : defaultDown(sort);
  return (
    <div className="jp-nbdist-runFilters">
      <input
        type="search"
        className="jp-mod-styled jp-nbdist-runSearch"
        placeholder="Search runs by name"
        aria-label="search runs by name"
        value={query.q ?? ''}
        onChange={e => props.onQuery({ q: e.target.value, offset: 0 })}
      />
      <div className="jp-nbdist-runFilterRow">
        <select
          className="jp-mod-styled"
          aria-label="status filter"
          value={query.status ?? ''}
          onChange={e => props.onQuery({ status: e.target.value, offset: 0 })}
        >
          <option value="">any status</option>
          {STATUSES.map(s => (
            <option key={s} value={s}>
              {s}
            </option>
          ))}
        </select>
        <select
          className="jp-mod-styled"
          aria-label="sort runs by"
          value={sort}
          onChange={e => props.onQuery({ sort: e.target.value, order: '', offset: 0 })}
        >
          {sorts.map(([key, label]) => (
            <option key={key} value={key}>
              {label}
            </option>
          ))}
        </select>
        <Button
          small
          minimal
          className="jp-nbdist-runOrder"
          aria-label={down ? 'descending: click for ascending' : 'ascending: click for descending'}
          title={
            down ? 'From the greatest (click to reverse)' : 'From the least (click to reverse)'
          }
          onClick={() => props.onQuery({ order: down ? 'asc' : 'desc', offset: 0 })}
        >
          {down ? '↓' : '↑'}
        </Button>
      </div>
      <div className="jp-nbdist-runFilterRow">
        <ColumnPicker columns={props.columns} metrics={metrics} onColumns={props.onColumns} />
        <label className="jp-nbdist-allCells" title="List every cell, not only runs">
          <input
            type="checkbox"
            checked={Boolean(query.all)}
            onChange={e => props.onQuery({ all: e.target.checked, offset: 0 })}
          />
          all cells
        </label>
      </div>
    </div>
  );
}

/** Which way a sort goes unless told (as the server's `listing`). */
function defaultDown(sort: string): boolean {
  return ['time', 'duration', 'step'].includes(sort);
}

function ColumnPicker(props: {
  columns: string[];
  metrics: string[];
  onColumns: (columns: string[]) => void;
}): JSX.Element {
  const choices = [...Object.keys(FIELD_COLUMNS), ...props.metrics];
  for (const c of props.columns) {
    if (!choices.includes(c)) {
      choices.push(c);
    }
  }
  const toggle = (c: string, on: boolean) =>
    props.onColumns(on ? [...props.columns, c] : props.columns.filter(x => x !== c));
  return (
    <details className="jp-nbdist-columns">
      <summary title="Choose the table's columns">columns</summary>
      <div className="jp-nbdist-columnList" role="group" aria-label="columns">
        {choices.map(c => (
          <label key={c}>
            <input
              type="checkbox"
              checked={props.columns.includes(c)}
              onChange={e => toggle(c, e.target.checked)}
            />
            {FIELD_COLUMNS[c] ?? c}
          </label>
        ))}
      </div>
    </details>
  );
}

function RunRows(props: IRunTableProps & { page: IRunsPage }): JSX.Element {
  const { page, columns, query } = props;
  const anchor = React.useRef<number | null>(null); // the run clicked last, for shift-click
  const sort = query.sort || 'time';
  const click = (e: React.MouseEvent, r: IRun) => {
    if ((e.target as HTMLElement).closest('input')) {
      return; // the checkbox speaks for itself
    }
    const on = !props.selected.includes(r.id);
    if (e.shiftKey && anchor.current !== null) {
      const ids = page.runs.map(run => run.id);
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
  const heading = (c: string) => {
    const key = c === 'started' ? 'time' : c === 'ranks' ? '' : c;
    const active = key !== '' && key === sort;
    return (
      <th
        key={c}
        data-column={c}
        aria-sort={active ? (isDown(query) ? 'descending' : 'ascending') : undefined}
        title={key ? `sort by ${FIELD_COLUMNS[c] ?? c}` : undefined}
        className={key ? 'jp-nbdist-sortable' : ''}
        onClick={() => key && props.onQuery({ sort: key, order: active ? flip(query) : '' })}
      >
        {FIELD_COLUMNS[c] ?? c}
        {active ? (isDown(query) ? ' ▾' : ' ▴') : ''}
      </th>
    );
  };
  return (
    <table className="jp-nbdist-runTable">
      <thead>
        <tr>
          <th className="jp-nbdist-selectCell" />
          <th>name</th>
          {columns.map(heading)}
        </tr>
      </thead>
      <tbody className="jp-nbdist-runs">
        {page.runs.map(r => {
          const selected = props.selected.includes(r.id);
          return (
            <tr
              key={r.id}
              className="jp-nbdist-pastRun"
              data-run-id={r.id}
              data-status={r.status}
              data-selected={String(selected)}
              data-listed={String(r.listed)}
              title={rowTitle(r)}
              onClick={e => click(e, r)}
            >
              <td className="jp-nbdist-selectCell">
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
              </td>
              <td className="jp-nbdist-nameCell">
                <span className={`jp-nbdist-dot jp-nbdist-run-${r.status}`} />
                <button type="button" className="jp-nbdist-runName jp-nbdist-runOpen">
                  {r.label || r.name || `#${r.id}`}
                </button>
              </td>
              {columns.map(c => (
                <td key={c} data-column={c} className="jp-nbdist-num">
                  {cell(r, c)}
                </td>
              ))}
            </tr>
          );
        })}
      </tbody>
    </table>
  );
}

function isDown(q: IRunsQuery): boolean {
  return q.order ? q.order === 'desc' : defaultDown(q.sort || 'time');
}

function flip(q: IRunsQuery): 'asc' | 'desc' {
  return isDown(q) ? 'asc' : 'desc';
}

/** The row's tooltip: its id and name, its start, its error, how to use it. */
function rowTitle(r: IRun): string {
  const name = r.label || r.name;
  const parts = [`#${r.id}${name ? ` ${name}` : ''}`, r.status];
  parts.push(`started ${new Date(r.started * 1000).toLocaleString()}`);
  if (r.error) {
    parts.push(r.error);
  }
  return `${parts.join(' · ')}\nclick to open; tick (or ctrl-click) to compare`;
}

/** A run's value in column `c`. */
function cell(r: IRun, c: string): string {
  switch (c) {
    case 'status':
      return r.status;
    case 'step':
      return stepText(r.step, null);
    case 'duration':
      return runLengthShort(r);
    case 'started':
      return new Date(r.started * 1000).toLocaleTimeString([], {
        hour: '2-digit',
        minute: '2-digit'
      });
    case 'ranks':
      return fmtInt(r.world_size);
  }
  const value = r.summary[c]?.last;
  if (value === undefined && c === 'loss') {
    return lossText(r); // a run whose summary an older store did not keep
  }
  return value === undefined || value === null ? MISSING : fmt(value);
}

function Pager(props: {
  page: IRunsPage;
  onQuery: (change: Partial<IRunsQuery>) => void;
}): JSX.Element {
  const { page } = props;
  const first = page.runs.length ? page.offset + 1 : 0;
  const last = page.offset + page.runs.length;
  return (
    <div className="jp-nbdist-pager">
      <Button
        small
        minimal
        disabled={page.offset === 0}
        title="The previous page of runs"
        onClick={() => props.onQuery({ offset: Math.max(0, page.offset - page.limit) })}
      >
        ‹ prev
      </Button>
      <span className="jp-nbdist-pagerText" data-testid="nbdist-runs-count">
        {`${fmtInt(first)}–${fmtInt(last)} of ${fmtInt(page.total)}`}
      </span>
      <Button
        small
        minimal
        disabled={last >= page.total}
        title="The next page of runs"
        onClick={() => props.onQuery({ offset: page.offset + page.limit })}
      >
        next ›
      </Button>
    </div>
  );
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
