// Shared by nbdist's two boards (dashboard.js, sweep.js, which import it; extension/build-boards.mjs
// bundles each into one module). Curves decimated by the kernel's rule, the boards' state in the
// browser, a view's life, and DOM helpers that set text as text. Numbers are written by
// extension/src/format.ts, charts drawn by extension/src/chart.ts: the sidebar's own.

import { MetricChart } from "@nbdist/chart";

export const MAX_POINTS = 2000; // per series, kept by decimation
export const PALETTE = [
  "#1f77b4",
  "#ff7f0e",
  "#2ca02c",
  "#d62728",
  "#9467bd",
  "#8c564b",
  "#e377c2",
  "#7f7f7f",
  "#bcbd22",
  "#17becf",
];

// -- a series: at most MAX_POINTS points, at one resolution along the run --------------------
// The same rule as the kernel's (nbdist/notebook/board/curves.py): points go into a bucket of
// `stride` points, a full bucket keeps its lowest and highest point, and when the series is full
// it is halved (pairs of buckets merged) and `stride` doubles. Spikes survive; the start of a
// long run is drawn at the same resolution as its end.
export class Series {
  constructor(stride = 2) {
    this.x = [];
    this.y = [];
    this.stride = Math.max(2, stride);
    this.lo = null; // [x, y] of the open bucket's lowest and highest points
    this.hi = null;
    this.count = 0;
  }
  static of(xs, ys, stride) {
    const s = new Series(stride);
    for (let i = 0; i < xs.length; i++) {
      if (ys[i] !== null && Number.isFinite(ys[i])) {
        s.x.push(xs[i]);
        s.y.push(ys[i]);
      }
    }
    return s;
  }
  push(x, y) {
    if (y === null || !Number.isFinite(y)) return;
    if (this.lo === null) {
      this.lo = [x, y];
      this.hi = [x, y];
    } else {
      if (y < this.lo[1]) this.lo = [x, y];
      if (y >= this.hi[1]) this.hi = [x, y]; // ties: the later point
    }
    if (++this.count >= this.stride) this.close();
  }
  extend(xs, ys) {
    for (let i = 0; i < xs.length; i++) this.push(xs[i], ys[i]);
  }
  close() {
    const pts =
      this.lo[0] <= this.hi[0] ? [this.lo, this.hi] : [this.hi, this.lo];
    for (const [i, p] of pts.entries()) {
      if (i === 1 && p === pts[0]) break;
      this.x.push(p[0]);
      this.y.push(p[1]);
    }
    this.lo = this.hi = null;
    this.count = 0;
    if (this.x.length > MAX_POINTS) this.halve();
  }
  // Each group of four points (two buckets) keeps its lowest and highest, in x order.
  halve() {
    const x = [];
    const y = [];
    for (let i = 0; i < this.x.length; i += 4) {
      let lo = i;
      let hi = i;
      for (let j = i; j < Math.min(i + 4, this.x.length); j++) {
        if (this.y[j] < this.y[lo]) lo = j;
        if (this.y[j] >= this.y[hi]) hi = j;
      }
      for (const k of lo === hi ? [lo] : lo < hi ? [lo, hi] : [hi, lo]) {
        x.push(this.x[k]);
        y.push(this.y[k]);
      }
    }
    this.x = x;
    this.y = y;
    this.stride *= 2;
  }
  // What to draw: the kept points and the open bucket's.
  view() {
    if (this.lo === null) return { x: this.x, y: this.y };
    const pts =
      this.lo === this.hi
        ? [this.lo]
        : this.lo[0] <= this.hi[0]
          ? [this.lo, this.hi]
          : [this.hi, this.lo];
    return {
      x: this.x.concat(pts.map((p) => p[0])),
      y: this.y.concat(pts.map((p) => p[1])),
    };
  }
  get length() {
    return this.x.length + (this.lo === null ? 0 : 1);
  }
}

export function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

// -- a board's state in the browser, shared by all its views -----------------------------------
// The kernel's `history` (everything so far, decimated) replaces it; its custom messages
// ({kind: "delta", seq}) add what is new. A board's store says what it holds (`reset`) and how a
// message goes in (`merge`, returning what changed); views subscribe to `views`.
// Made when the front end makes the model (whether or not a view is drawn yet, the tab in front
// or not), it tells the kernel so once: `widget.seen` (read between cells).
export class BoardStore {
  constructor(model) {
    this.model = model;
    this.views = new Set();
    this.seq = 0;
    this.reset();
    this.load(model.get("history"));
    model.on("change:history", () => this.load(model.get("history")));
    model.on("change:head", () => this.notify({ head: true }));
    model.on("msg:custom", (msg) => this.delta(msg));
    model.send({ kind: "seen" });
  }
  head() {
    return this.model.get("head") || {};
  }
  // Everything so far (decimated): replaces what this store holds.
  load(h) {
    if (!h || !h.seq || h.seq <= this.seq) return;
    this.reset();
    this.seq = h.seq;
    this.merge(h);
    this.notify({ all: true });
  }
  // What changed since the last message: appended to what this store holds.
  delta(msg) {
    if (!msg || msg.kind !== "delta" || msg.seq <= this.seq) return;
    this.seq = msg.seq;
    this.notify(this.merge(msg));
  }
  notify(changed) {
    for (const view of this.views) view(changed);
  }
}

// One store per model (a notebook may show a board in several views).
const stores = new WeakMap();
export function storeOf(model, Kind) {
  if (!stores.has(model)) stores.set(model, new Kind(model));
  return stores.get(model);
}

// -- a chart per metric, in a grid ------------------------------------------------------------
// Each metric's chart appears when the metric is first reported; a chip per metric shows or hides
// it (the first SHOWN_AT_FIRST are shown; a hidden metric has no chart, so it costs nothing).
const SHOWN_AT_FIRST = 8;

export class ChartGrid {
  // options: {sync, xLabel, height}: what every chart of the grid shares
  constructor(parent, options) {
    this.options = options;
    this.node = el("div", "nbdist-grid");
    this.chips = el("div", "nbdist-grid-chips");
    this.grid = el("div", "nbdist-grid-charts");
    this.node.append(this.chips, this.grid);
    parent.append(this.node);
    this.charts = new Map(); // metric -> MetricChart
    this.names = [];
    this.shown = new Set();
    this.redraw = () => {};
  }
  // `names`, in order; `linesOf(name)`: its chart's lines; `only`: the metrics that changed
  draw(names, linesOf, only = null) {
    this.redraw = () => this.draw(this.names, linesOf);
    if (names.join("\n") !== this.names.join("\n")) {
      for (const name of names.slice(this.names.length, SHOWN_AT_FIRST))
        this.shown.add(name);
      this.names = [...names];
      this.drawChips();
    }
    this.node.style.display = names.length ? "" : "none";
    for (const name of this.names) {
      let chart = this.charts.get(name);
      if (!this.shown.has(name)) {
        if (chart) chart.destroy();
        this.charts.delete(name);
        continue;
      }
      if (!chart) {
        chart = new MetricChart(this.grid, { title: name, ...this.options });
        chart.node.dataset.metric = name;
        this.charts.set(name, chart);
        only = null; // a new chart is drawn whole
      }
      if (only === null || only.has(name)) chart.setLines(linesOf(name));
    }
    // charts in the order of their metrics
    for (const name of this.names) {
      const chart = this.charts.get(name);
      if (chart) this.grid.append(chart.node);
    }
  }
  drawChips() {
    this.chips.textContent = "";
    if (this.names.length < 2) return;
    for (const name of this.names) {
      const chip = el("label", "nbdist-chip");
      const box = el("input");
      box.type = "checkbox";
      box.checked = this.shown.has(name);
      box.addEventListener("change", () => {
        if (box.checked) this.shown.add(name);
        else this.shown.delete(name);
        this.redraw();
      });
      chip.append(box, el("span", "", name));
      this.chips.append(chip);
    }
    this.chips.append(
      el(
        "span",
        "nbdist-chip-count",
        `${this.shown.size} of ${this.names.length} shown`,
      ),
    );
  }
  destroy() {
    for (const chart of this.charts.values()) chart.destroy();
    this.charts.clear();
  }
}

// -- a view's life: drawn at the store's news; the theme mirrored on the root (the charts follow
// the theme and their size themselves); undone on removal --------------------------------------
export function follow(root, store, draw, undo) {
  const mirror = () => {
    root.dataset.theme = document.body.dataset.jpThemeLight || "";
  };
  mirror(); // from the start (JupyterLab and Notebook 7 both mark the body)
  const theme = new MutationObserver(mirror);
  theme.observe(document.body, {
    attributes: true,
    attributeFilter: ["data-jp-theme-light"],
  });
  store.views.add(draw);
  draw({ all: true });
  return () => {
    store.views.delete(draw);
    theme.disconnect();
    undo();
  };
}
