/**
 * What the sidebar holds: the panel (panel.tsx) fills it from the server, the views (views.tsx,
 * card.tsx) draw it. Both import it from here, so neither imports the other's module for it.
 */
import { ICluster, ICurves, IRun, IRunsPage, IRunsQuery, IWorker } from './api';

/** Everything the views draw. */
export interface IPanelState {
  clusters: ICluster[];
  page: IRunsPage | null; // the runs table's page in view
  query: IRunsQuery; // what the table asks for (its page, search, filter, sort)
  columns: string[]; // the table's columns besides the name
  focus: IRun | null; // the live run, or else the latest one
  curves: ICurves | null; // the focused run's card curve (its id is curves.run_id)
  cardMetric: string; // the metric on the card: loss, or the first one reported
  workers: IWorker[];
  selected: number[]; // runs ticked for comparing, in the order ticked (on any page)
  loaded: boolean;
  unreachable: boolean;
  error: string; // the last action's error, one line
  busy: boolean;
  lastOk: number;
}

/** What the sidebar asks of JupyterLab's main area (opener.ts): a run's view, a comparison. */
export interface IOpener {
  openRun(run: IRun): void;
  compare(runs: IRun[]): void;
}
