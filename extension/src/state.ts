/**
 * What the sidebar holds: the panel (panel.tsx) fills it from the server, the views (views.tsx)
 * draw it. Both import it from here, so neither imports the other's module for it.
 */
import { ICluster, IRun, IWorker } from './api';

/** Everything the views draw. */
export interface IPanelState {
  clusters: ICluster[];
  runs: IRun[];
  focus: IRun | null; // the live run, or else the latest one
  curve: { step: number; loss: number }[];
  workers: IWorker[];
  loaded: boolean;
  unreachable: boolean;
  error: string; // the last action's error, one line
  busy: boolean;
  lastOk: number;
}
