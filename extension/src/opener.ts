/**
 * Opens runs in JupyterLab's main area: one view per run (opened again, it is brought to the
 * front), one per set of runs compared. The views' code (and uPlot, which they draw with) loads
 * on the first open, not with the sidebar.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { Widget } from '@lumino/widgets';

import { IRun } from './api';
import { IOpener } from './state';

export class RunOpener implements IOpener {
  constructor(shell: JupyterFrontEnd.IShell) {
    this._shell = shell;
  }

  openRun(run: IRun): void {
    void this._show(`nbdist-run-${run.id}`, async () => {
      const { RunView } = await import('./runview');
      return new RunView(run);
    });
  }

  compare(runs: IRun[]): void {
    const sorted = [...runs].sort((a, b) => a.id - b.id); // oldest first, as TensorBoard lists
    void this._show(`nbdist-compare-${sorted.map(r => r.id).join('-')}`, async () => {
      const { CompareView } = await import('./compare');
      return new CompareView(sorted);
    });
  }

  /** Bring the widget `id` to the front, making it first if it is not open. */
  private async _show(id: string, make: () => Promise<Widget>): Promise<void> {
    let widget = this._open.get(id);
    if (widget !== undefined && !widget.isDisposed && !widget.isAttached) {
      widget.dispose(); // taken out of the shell some other way: made anew
    }
    if (widget === undefined || widget.isDisposed) {
      const pending = this._making.get(id) ?? make();
      this._making.set(id, pending);
      try {
        widget = await pending;
      } finally {
        this._making.delete(id);
      }
      if (!this._open.get(id)?.isAttached) {
        widget.id = id;
        this._open.set(id, widget);
        widget.disposed.connect(this._forget, this);
        this._shell.add(widget, 'main');
      }
    }
    this._shell.activateById(id);
  }

  private _forget(widget: Widget): void {
    if (this._open.get(widget.id) === widget) {
      this._open.delete(widget.id);
    }
  }

  private _shell: JupyterFrontEnd.IShell;
  private _open = new Map<string, Widget>();
  private _making = new Map<string, Promise<Widget>>();
}
