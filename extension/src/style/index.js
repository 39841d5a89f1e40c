import 'uplot/dist/uPlot.min.css';
import './chart.css';
import './marks.css';
import './base.css';
import './views.css';
import './runlist.css';
import './workers.css';
