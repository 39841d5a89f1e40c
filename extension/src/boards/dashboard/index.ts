/**
 * nbdist's live dashboard of one run, drawn by the browser: an anywidget ES module, bundled with
 * what it imports by extension/build-boards.mjs into nbdist/notebook/board/static/built/
 * dashboard.js (nothing is fetched at run time), which `board.widget.DashboardWidget` serves.
 *
 * The kernel (nbdist/notebook/board/dashboard.py) keeps the run's state and sends only what is
 * new, a few times a second (messages.ts); a view starts from the synced `history` and `head`.
 * Every metric passed to report() has a chart, each per rank and their mean. Curves are
 * decimated here too (../series.ts), so a run of a million steps costs the browser what a run of
 * a thousand does. Everything that came from an engine (host names, log lines, messages, metric
 * names) is set as text, never as HTML.
 */
import { boardModule } from '../store';
import { DashboardStore } from './store';
import { render } from './view';

// for the tests (tests/unit/test_dashboard_js.py)
export { Series } from '../series';
export { columnFormat, fmt, fmtDuration, fmtInt } from '../../format';
export { broken, readings } from '../../plotdata';
export { rankLines } from '../../smoothing';
export { MetricFormats } from './numbers';
export { inView } from './store';

export default boardModule(DashboardStore, render);
