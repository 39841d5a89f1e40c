/**
 * One chart of one metric: lines (each rank, their mean, or one run each) against a shared x axis,
 * drawn by uPlot. The run's board, the sweep's board (bundled by build-boards.mjs) and the
 * sidebar's run views all draw with it, so they behave alike:
 *
 * - a `log` toggle for the y axis (log10 when every value is positive, else asinh, which is
 *   linear around zero and logarithmic beyond);
 * - a readout, as text in the page, of the x under the mouse and each line's value there, read
 *   from the line's own stored points (a decimated line's nearest, its step named when it is not
 *   the cursor's), smoothed values labelled so with the raw one beside; the latest values when
 *   the mouse is elsewhere; one number format for the chart (`setFormat`, or chosen from the raw
 *   values, so smoothing never changes it); charts given the same `sync` key share the cursor;
 * - drag across to zoom in on x, double-click to see everything again; new points do not undo a
 *   zoom;
 * - sharp always: the canvas is sized to the chart's displayed width x devicePixelRatio whenever
 *   it changes size or comes into view, and a hidden chart keeps its last real size (never a
 *   guessed one). Colours are read from the page's theme at each drawing, and a theme switch
 *   redraws;
 * - bands: spans of x shaded and named under the lines (the time a run spent recovering), named
 *   in the readout too.
 *
 * Text is set as text: labels may come from engines.
 */
import uPlot from 'uplot';

import { el } from './dom';
import { axisFormat, columnFormat, fmt, fmtInt } from './format';
import { finiteTail, IBand, ILine, isDecade, join, readings } from './plotdata';

export { IBand, ILine } from './plotdata';

export interface IChartOptions {
  title: string;
  /** The x axis' name, shown in the readout: "step", "seconds". */
  xLabel?: string;
  /** The plot's height in CSS pixels. */
  height?: number;
  /** Charts with the same key share their cursor (they share the x axis). */
  sync?: string;
  /** The y axis starts at zero (throughput). */
  zeroBased?: boolean;
  log?: boolean;
  /** What to say while there are no points. */
  empty?: string;
}

/** At most this many lines are named one by one in the readout; beyond, their spread. */
const READOUT_LINES = 9;
const FONT = '11px system-ui, -apple-system, "Segoe UI", sans-serif';

export class MetricChart {
  /** The chart's element: its head (title, readout, log toggle) and the plot. */
  readonly node: HTMLDivElement;

  constructor(parent: HTMLElement | null, options: IChartOptions) {
    this._opts = options;
    this._log = !!options.log;
    this.node = el('div', 'nbdist-chart');
    const head = el('div', 'nbdist-chart-head');
    head.append(el('span', 'nbdist-chart-title', options.title));
    this._logButton = el('button', 'nbdist-chart-log', 'log');
    this._logButton.type = 'button';
    this._logButton.title = 'logarithmic y axis';
    this._logButton.addEventListener('click', () => this.setLog(!this._log));
    head.append(this._logButton);
    this._readout = el('div', 'nbdist-chart-readout');
    this._plotBox = el('div', 'nbdist-chart-plot');
    this._plotBox.style.height = `${this._height()}px`;
    this.node.append(head, this._readout, this._plotBox);
    this._syncLog();
    if (parent) {
      parent.append(this.node);
    }
    // Sharp always: fit the canvas whenever the box changes size or comes into view.
    this._resize = new ResizeObserver(() => this.fit());
    this._resize.observe(this._plotBox);
    this._visible = new IntersectionObserver(entries => {
      this._onScreen = entries[entries.length - 1].isIntersecting;
      if (this._onScreen) {
        this._draw();
        this.fit();
      }
    });
    this._visible.observe(this._plotBox);
    this._theme = new MutationObserver(() => this._plot?.redraw(false));
    this._theme.observe(document.body, {
      attributes: true,
      attributeFilter: ['data-jp-theme-light', 'data-jp-theme-name']
    });
  }

  /** Is the y axis logarithmic? */
  get log(): boolean {
    return this._log;
  }

  /** Is the chart zoomed in on part of its x axis? */
  get zoomed(): boolean {
    return this._range !== null;
  }

  /** The lines to draw, replacing the last ones (a zoom stays). */
  setLines(lines: ILine[]): void {
    this._pending = lines;
    if (this._onScreen) {
      this._draw();
    }
  }

  /** The number format of the readout (a board's one format for this metric); null: chosen
   * from the lines' raw values. Applies from the next drawing. */
  setFormat(format: ((v: number | null) => string) | null): void {
    this._fixedFormat = format;
  }

  /** The bands to shade, replacing the last ones: drawn with the next lines (`setLines`). */
  setBands(bands: IBand[]): void {
    this._bands = bands;
    this.node.dataset.bands = String(bands.length);
  }

  /** Bring the line labelled `label` forward, the others dimmed; null: all alike again. */
  focus(label: string | null): void {
    const plot = this._plot;
    this._focus = label;
    this.node.dataset.focus = label ?? '';
    if (!plot) {
      return;
    }
    const i = label === null ? -1 : this._lines.findIndex(l => l.label === label);
    plot.setSeries(null, { focus: false });
    if (i >= 0) {
      plot.setSeries(i + 1, { focus: true });
    }
  }

  /** Draw the latest lines (charts out of view wait: drawing them would be work unseen). */
  private _draw(): void {
    const lines = this._pending;
    if (lines === null) {
      return;
    }
    this._pending = null;
    this.node.dataset.lines = String(lines.filter(l => l.x.length).length);
    const shape = lines
      .map(l => `${l.label}|${l.colour}|${l.width}|${l.alpha}|${l.dash}|${l.gaps}|${l.band}`)
      .join('\n');
    this._lines = lines;
    this._data = join(lines);
    this._format = this._fixedFormat ?? columnFormat(lines.flatMap(l => finiteTail(l.raw ?? l.y)));
    if (!this._plot || shape !== this._shape || this._positiveOnly() !== this._positive) {
      this._shape = shape;
      this._build();
    } else {
      this._plot.setData(this._data, this._range === null);
      if (this._range) {
        this._plot.setScale('x', { min: this._range[0], max: this._range[1] });
      }
    }
    if (this._focus !== null) {
      this.focus(this._focus);
    }
    this._showReadout(null);
  }

  /** Switch the y axis between linear and logarithmic. */
  setLog(on: boolean): void {
    this._log = on;
    this._syncLog();
    this._draw();
    this._build();
  }

  /** Fit the canvas to the displayed size (x devicePixelRatio); a hidden chart keeps its own. */
  fit(): void {
    const width = Math.floor(this._plotBox.clientWidth);
    const plot = this._plot;
    if (!plot || width <= 0) {
      return;
    }
    const dpr = window.devicePixelRatio || 1;
    const height = this._height();
    if (
      plot.width !== width ||
      plot.height !== height ||
      plot.ctx.canvas.width !== Math.round(width * dpr)
    ) {
      if (Math.abs(uPlot.pxRatio - dpr) > 1e-6) {
        this._build(); // the ratio changed (another screen, browser zoom): a new canvas
      } else {
        plot.setSize({ width, height });
      }
    }
  }

  /** Stop observing and free the plot. */
  destroy(): void {
    this._resize.disconnect();
    this._visible.disconnect();
    this._theme.disconnect();
    this._plot?.destroy();
    this._plot = null;
    this.node.remove();
  }

  // -- building ---------------------------------------------------------------------------------
  private _height(): number {
    return this._opts.height ?? 150;
  }

  private _positiveOnly(): boolean {
    return this._lines.every(l => Array.from(l.y).every(v => v === null || v > 0));
  }

  private _build(): void {
    this._plot?.destroy();
    this._plot = null;
    this._plotBox.textContent = '';
    if (!this._lines.some(l => l.x.length)) {
      this._plotBox.append(el('div', 'nbdist-chart-empty', this._opts.empty ?? 'no points yet'));
      return;
    }
    this._positive = this._positiveOnly();
    const width = Math.floor(this._plotBox.clientWidth) || 400; // corrected by fit() when shown
    this._plot = new uPlot(this._options(width), this._data, this._plotBox);
    if (this._range) {
      this._plot.setScale('x', { min: this._range[0], max: this._range[1] });
    }
  }

  private _options(width: number): uPlot.Options {
    const text = (): string => cssVar(this.node, '--jp-ui-font-color2', '#616161');
    const grid = (): string => cssVar(this.node, '--jp-border-color2', '#e0e0e0');
    const strong = (): string => cssVar(this.node, '--jp-ui-font-color0', '#000');
    const y: uPlot.Scale = {};
    if (this._log) {
      if (this._positive) {
        Object.assign(y, { distr: 3, log: 10 });
      } else {
        Object.assign(y, { distr: 4, log: 10, asinh: this._linearBelow() });
      }
    } else if (this._opts.zeroBased) {
      y.range = (_u, _min, max) => [0, max > 0 ? max * 1.05 : 1];
    }
    // a log axis: gridlines, ticks and labels at the powers of ten only (not at 2..9 of each)
    const decades =
      this._log && this._positive
        ? (_u: uPlot, splits: number[]) => splits.map(v => (isDecade(v) ? v : null))
        : undefined;
    // (no `filter: undefined`: uPlot's assign() would put it over its own default filter)
    const only = (side: 'x' | 'y') => (side === 'y' && decades ? { filter: decades } : {});
    const axis = (side: 'x' | 'y'): uPlot.Axis => ({
      stroke: text,
      font: FONT,
      grid: { stroke: grid, width: 1, ...only(side) },
      ticks: { stroke: grid, width: 1, size: 4, ...only(side) },
      size: side === 'x' ? 30 : 56,
      values: (_u, splits) => axisFormat(splits),
      filter: side === 'y' ? decades : undefined
    });
    // bands: a line's area shaded down to another's (the ranks' max to their min)
    const bands: uPlot.Band[] = [];
    this._lines.forEach((l, i) => {
      const to = l.band === undefined ? -1 : this._lines.findIndex(o => o.label === l.band);
      if (to >= 0) {
        bands.push({ series: [i + 1, to + 1], fill: fade(l.colour, 0.18) });
      }
    });
    return {
      width,
      height: this._height(),
      bands,
      legend: { show: false },
      scales: { x: { time: false }, y },
      axes: [axis('x'), axis('y')],
      series: [
        { label: this._opts.xLabel ?? 'step' },
        ...this._lines.map(l => ({
          label: l.label,
          stroke: l.colour === 'strong' ? strong : l.colour,
          width: l.width ?? 1,
          alpha: l.alpha ?? 1,
          dash: l.dash,
          spanGaps: !l.gaps,
          points: { show: false }
        }))
      ],
      focus: { alpha: 0.25 },
      cursor: {
        // charts of one board share the cursor (its step), not their zoom: each zooms alone
        sync: this._opts.sync
          ? {
              key: this._opts.sync,
              scales: [null, null],
              filters: { pub: type => type === 'mousemove' || type === 'mouseleave' }
            }
          : undefined,
        drag: { x: true, y: false, setScale: false },
        points: { show: false },
        bind: {
          dblclick: () => () => {
            this._unzoom();
            return null;
          }
        }
      },
      hooks: {
        drawAxes: [u => this._drawBands(u)],
        setSelect: [u => this._zoom(u)],
        setCursor: [u => this._showReadout(u.cursor.idx ?? null)]
      }
    };
  }

  /** The bands, shaded over the grid and under the lines, each named at its foot (a line from
   * zero runs high): inside it when it is wide enough, else beside it. `data-band-px`: each
   * one's left and right edge on the canvas (the browser tests read the pixels between). */
  private _drawBands(u: uPlot): void {
    const ctx = u.ctx;
    const { left, top, width, height } = u.bbox;
    const pad = 4 * uPlot.pxRatio;
    const edges: string[] = [];
    ctx.save();
    ctx.font = FONT.replace('11px', `${Math.round(11 * uPlot.pxRatio)}px`);
    ctx.textBaseline = 'bottom';
    ctx.textAlign = 'left'; // (uPlot's axes leave theirs)
    for (const band of this._bands) {
      const x0 = Math.max(left, u.valToPos(band.from, 'x', true));
      const x1 = Math.min(left + width, u.valToPos(band.to, 'x', true));
      if (!(x1 > x0)) {
        continue;
      }
      edges.push(`${Math.round(x0)}-${Math.round(x1)}`);
      ctx.fillStyle = band.colour;
      ctx.globalAlpha = 0.2;
      ctx.fillRect(x0, top, x1 - x0, height);
      ctx.globalAlpha = 1;
      const text = ctx.measureText(band.label).width;
      const inside = text + 2 * pad <= x1 - x0;
      const after = x1 + pad + text <= left + width;
      const x = inside ? x0 + pad : after ? x1 + pad : x0 - pad - text;
      ctx.fillText(band.label, x, top + height - pad);
    }
    ctx.restore();
    this.node.dataset.bandPx = edges.join(' ');
  }

  /** asinh's linear band: below the smallest magnitude shown, so decades above it spread out. */
  private _linearBelow(): number {
    let least = Infinity;
    for (const l of this._lines) {
      for (const v of Array.from(l.y)) {
        if (v !== null && v !== 0 && Math.abs(v) < least) {
          least = Math.abs(v);
        }
      }
    }
    return Number.isFinite(least) ? least : 1;
  }

  private _syncLog(): void {
    this._logButton.setAttribute('aria-pressed', String(this._log));
    this.node.dataset.log = String(this._log);
  }

  // -- zoom -------------------------------------------------------------------------------------
  private _zoom(u: uPlot): void {
    const sel = u.select;
    if (sel.width < 4) {
      return;
    }
    const lo = u.posToVal(sel.left, 'x');
    const hi = u.posToVal(sel.left + sel.width, 'x');
    u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
    this._range = [lo, hi];
    u.setScale('x', { min: lo, max: hi });
    this.node.dataset.zoomed = 'true';
    this._showReadout(null);
  }

  private _unzoom(): void {
    this._range = null;
    delete this.node.dataset.zoomed;
    this._plot?.setData(this._data, true);
    this._showReadout(null);
  }

  // -- the readout ------------------------------------------------------------------------------
  /** The x at data index `idx` and each line's reading there (`readings`: its own stored point
   * nearest that x); the latest when null. Smoothed values are labelled so, the raw beside. */
  private _showReadout(idx: number | null): void {
    const xs = this._data[0] as number[];
    if (!xs.length) {
      this._readout.textContent = '';
      delete this.node.dataset.readout;
      return;
    }
    const at = idx ?? xs.length - 1;
    const x = xs[at];
    const xLabel = this._opts.xLabel ?? 'step';
    const fx = (v: number) => (xLabel === 'step' ? fmtInt(v) : fmt(v));
    const parts: string[] = [`${idx === null ? 'latest · ' : ''}${xLabel} ${fx(x)}`];
    const read = readings(this._lines, x);
    const smoothing = this._lines.some(l => l.raw);
    if (smoothing) {
      parts.push('smoothed (raw)');
    }
    const f = this._format;
    const named = read.length <= READOUT_LINES ? read : read.filter(r => r.label === 'mean');
    for (const r of named) {
      const raw = smoothing ? ` (${f(r.raw)})` : '';
      const elsewhere = r.x !== x ? ` at ${xLabel} ${fx(r.x)}` : '';
      parts.push(`${r.label} ${f(r.y)}${raw}${elsewhere}`);
    }
    if (read.length > READOUT_LINES) {
      const ys = read.map(r => r.y);
      parts.push(`min ${f(Math.min(...ys))}`, `max ${f(Math.max(...ys))}`);
    }
    const band = this._bands.find(b => b.from <= x && x <= b.to);
    if (band) {
      parts.push(band.label);
    }
    if (this._range) {
      parts.push('double-click to see all');
    }
    this._readout.textContent = parts.join(' · ');
    this._readout.title = this._readout.textContent; // in full, where the chart is narrow
    this.node.dataset.readoutStep = String(x);
    // what the readout says, exactly (the browser tests hold it against the run store)
    this.node.dataset.readout = JSON.stringify(named);
  }

  private _opts: IChartOptions;
  private _log: boolean;
  private _logButton: HTMLButtonElement;
  private _readout: HTMLElement;
  private _plotBox: HTMLElement;
  private _plot: uPlot | null = null;
  private _lines: ILine[] = [];
  private _bands: IBand[] = [];
  private _data: uPlot.AlignedData = [[]];
  private _shape = '';
  private _positive = true;
  private _range: [number, number] | null = null;
  private _format: (v: number | null) => string = v => fmt(v);
  private _fixedFormat: ((v: number | null) => string) | null = null;
  private _pending: ILine[] | null = null; // lines not drawn yet (the chart is out of view)
  private _onScreen = false;
  private _focus: string | null = null;
  private _resize: ResizeObserver;
  private _visible: IntersectionObserver;
  private _theme: MutationObserver;
}

/** A #rrggbb colour at `alpha`, as rgba(). */
function fade(colour: string, alpha: number): string {
  const m = /^#([0-9a-f]{2})([0-9a-f]{2})([0-9a-f]{2})$/i.exec(colour);
  if (!m) {
    return colour;
  }
  const [r, g, b] = m.slice(1).map(h => parseInt(h, 16));
  return `rgba(${r}, ${g}, ${b}, ${alpha})`;
}

function cssVar(node: Element, name: string, fallback: string): string {
  return getComputedStyle(node).getPropertyValue(name).trim() || fallback;
}
