/**
 * nbdist's live board of a hyperparameter sweep, drawn by the browser: an anywidget ES module,
 * bundled with what it imports by extension/build-boards.mjs into nbdist/notebook/board/static/
 * built/sweep.js (nothing is fetched at run time), which `board.widget.SweepWidget` serves.
 *
 * The kernel (nbdist/notebook/sweeps/board.py) keeps the sweep's state and sends only what is
 * new, a few times a second (messages.ts); a view starts from the synced `history` and `head`.
 * Every metric the trials report has a chart with one curve per trial, decimated here by the
 * kernel's rule (../series.ts). Everything that came from an engine or a user (trial values,
 * notes, error lines, the title) is set as text.
 */
import { boardModule } from '../store';
import { SweepStore } from './store';
import { render } from './view';

export default boardModule(SweepStore, render);
