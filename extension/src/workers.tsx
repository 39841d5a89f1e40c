/**
 * A run's ranks, each in the colour of its state: a tile per rank (its number, its state, its
 * place in the mesh, its wait for data) for a few ranks; for many (more than `TILES_UP_TO`), a
 * compact grid of one small cell per rank, its tooltip the rank's detail, with counts by state
 * and a table of every rank (host, state, CPU, step time, data wait, last report) a click away.
 * Drawn on the sidebar's card and in a run's view. The data wait (the share of its steps a rank
 * waited for the next batch of an nbdist loader) is shown when some rank has one; a cell of a
 * rank that waits `INPUT_BOUND` of its step or more is hollow.
 */
import React from 'react';

import { IRun, IWorker } from './api';
import {
  meshCoords,
  meshKey,
  meshTile,
  SHOWN_STATES,
  ShownState,
  shownState,
  workerTitle
} from './describe';
import { fmt, fmtDuration, fmtInt, MISSING } from './format';

/** Ranks drawn as tiles; past this, the compact grid. */
export const TILES_UP_TO = 16;
/** The share of its steps a rank waits for data from which it reads as input-bound. */
export const INPUT_BOUND = 0.5;

function inputBound(w: IWorker): boolean {
  return w.data_share !== null && w.data_share !== undefined && w.data_share >= INPUT_BOUND;
}

export function WorkerGrid(props: { workers: IWorker[]; run: IRun }): JSX.Element {
  const [table, setTable] = React.useState(false);
  if (props.workers.length === 0) {
    return (
      <p className="jp-nbdist-empty">
        {props.run.status === 'running' ? 'No worker health yet.' : 'No worker health was kept.'}
      </p>
    );
  }
  const shown = props.workers.map(w => [w, shownState(w, props.run)] as const);
  const present = SHOWN_STATES.filter(s => shown.some(([, state]) => state === s));
  const keyed = props.workers.map(w => meshCoords(w.mesh)).find(c => c.length > 0);
  const many = props.workers.length > TILES_UP_TO;
  const count = (s: ShownState) => shown.filter(([, state]) => state === s).length;
  const bound = many ? props.workers.filter(inputBound).length : 0;
  return (
    <div>
      {many ? <Cells shown={shown} /> : <Tiles shown={shown} />}
      <div className="jp-nbdist-legend">
        {present.map(s => (
          <span key={s} data-legend-state={s}>
            <span className={`jp-nbdist-dot jp-nbdist-state-${s}`} />
            {many ? `${s} ${fmtInt(count(s))}` : s}
          </span>
        ))}
        {bound > 0 && (
          <span data-legend-input-bound={bound}>
            <span className="jp-nbdist-dot nbdist-input-bound" />
            {`waiting for data ≥ ${fmtInt(INPUT_BOUND * 100)} % ${fmtInt(bound)}`}
          </span>
        )}
        {keyed && (
          <span className="jp-nbdist-meshKey" data-testid="nbdist-mesh-key">
            {meshKey(keyed)}
          </span>
        )}
        {many && (
          <button
            type="button"
            className="jp-nbdist-linkButton jp-nbdist-rankTableToggle"
            aria-expanded={table}
            onClick={() => setTable(!table)}
          >
            {table ? 'hide the table' : `table of ${fmtInt(props.workers.length)} ranks`}
          </button>
        )}
      </div>
      {many && table && <RankTable shown={shown} />}
    </div>
  );
}

type Shown = readonly (readonly [IWorker, ShownState])[];

/** A tile per rank: its number, its state, its place in the mesh. */
function Tiles(props: { shown: Shown }): JSX.Element {
  return (
    <RankList shown={props.shown} className="jp-nbdist-workers" item="">
      {(w, state) => (
        <>
          <span className="jp-nbdist-workerRank">{w.rank}</span>
          <span className="jp-nbdist-workerState">{state}</span>
          {w.mesh && (
            <span className="jp-nbdist-workerMesh" data-mesh={w.mesh}>
              {meshTile(meshCoords(w.mesh))}
            </span>
          )}
          {w.data_share !== null && w.data_share !== undefined && (
            <span
              className="jp-nbdist-workerData"
              data-share={w.data_share}
              title="of its steps spent waiting for the next batch"
            >
              {`data ${fmtInt(w.data_share * 100)}%`}
            </span>
          )}
        </>
      )}
    </RankList>
  );
}

/** One small cell per rank, in rank order, coloured by its state; its tooltip the detail. */
function Cells(props: { shown: Shown }): JSX.Element {
  return (
    <RankList shown={props.shown} className="jp-nbdist-rankCells" item="jp-nbdist-rankCell " />
  );
}

/** The ranks as a list, an item each (tiles or cells), coloured by state, titled with the
 * detail; `children` fills an item (a tile), else it is a cell, hollow when input-bound. */
function RankList(props: {
  shown: Shown;
  className: string;
  item: string;
  children?: (w: IWorker, state: ShownState) => JSX.Element;
}): JSX.Element {
  return (
    <div className={props.className} role="list" aria-label="workers">
      {props.shown.map(([w, state]) => (
        <div
          key={w.rank}
          role="listitem"
          data-rank={w.rank}
          data-state={state}
          data-reported={w.state}
          className={`${props.item}jp-nbdist-worker jp-nbdist-state-${state}${
            !props.children && inputBound(w) ? ' nbdist-input-bound' : ''
          }`}
          title={workerTitle(w)}
          aria-label={props.children ? undefined : `rank ${w.rank}: ${state}`}
        >
          {props.children?.(w, state)}
        </div>
      ))}
    </div>
  );
}

/** Every rank's detail, a row each, the ranks not ok first. */
function RankTable(props: { shown: Shown }): JSX.Element {
  const order = (s: ShownState) => (s === 'ok' || s === 'done' ? 1 : 0);
  const rows = [...props.shown].sort(
    ([a, sa], [b, sb]) => order(sa) - order(sb) || a.rank - b.rank
  );
  const data = rows.some(([w]) => w.data_share !== null && w.data_share !== undefined);
  return (
    <div className="jp-nbdist-rankTableBox">
      <table className="jp-nbdist-rankTable">
        <thead>
          <tr>
            <th>rank</th>
            <th>state</th>
            <th>host</th>
            <th>cpu %</th>
            {data && <th title="of its steps spent waiting for the next batch">data %</th>}
            <th>step</th>
            <th>last report</th>
          </tr>
        </thead>
        <tbody>
          {rows.map(([w, state]) => (
            <tr key={w.rank} data-rank={w.rank} data-state={state}>
              <td>{w.rank}</td>
              <td>
                <span className={`jp-nbdist-dot jp-nbdist-state-${state}`} />
                {state}
              </td>
              <td>{w.host || MISSING}</td>
              <td className="jp-nbdist-num">{w.cpu === null ? MISSING : fmt(w.cpu, 3)}</td>
              {data && (
                <td className="jp-nbdist-num jp-nbdist-dataShare">
                  {w.data_share === null || w.data_share === undefined
                    ? MISSING
                    : fmtInt(w.data_share * 100)}
                </td>
              )}
              <td className="jp-nbdist-num">
                {w.step_time === null ? MISSING : fmtDuration(w.step_time)}
              </td>
              <td className="jp-nbdist-num">
                {w.last_report_age === null ? MISSING : `${fmtDuration(w.last_report_age)} ago`}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}
