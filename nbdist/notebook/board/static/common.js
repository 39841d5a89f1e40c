// Shared by nbdist's two boards (dashboard.js, sweep.js): each widget's ES module is this
// file followed by its own (notebook/board/widget.py). Curves decimated by the kernel's rule, number
// formats, ticks, and DOM helpers that set text as text.

const MAX_POINTS = 2000; // per series, kept by decimation
const PALETTE = [
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
class Series {
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
      if (y > this.hi[1]) this.hi = [x, y];
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
        if (this.y[j] > this.y[hi]) hi = j;
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

// -- formatting -----------------------------------------------------------------------------
function fmt(v, digits = 4) {
  if (v === null || v === undefined) return "-";
  if (typeof v === "string") return v;
  if (!Number.isFinite(v)) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(2);
  return Number(v.toPrecision(digits)).toString();
}
function fmtInt(v) {
  return v === null || v === undefined
    ? "-"
    : Math.round(v).toLocaleString("en-US");
}
function fmtSecs(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return "?";
  s = Math.round(s);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const sec = String(s % 60).padStart(2, "0");
  return h ? `${h}:${String(m).padStart(2, "0")}:${sec}` : `${m}:${sec}`;
}
function niceTicks(lo, hi, count) {
  if (!(hi > lo)) return [lo];
  const step0 = (hi - lo) / count;
  const mag = Math.pow(10, Math.floor(Math.log10(step0)));
  const step =
    [1, 2, 5, 10].map((f) => f * mag).find((s) => s >= step0) || step0;
  const out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step)
    out.push(t);
  return out;
}
function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

// -- a board's state in the browser, shared by all its views -----------------------------------
// The kernel's `history` (everything so far, decimated) replaces it; its custom messages
// ({kind: "delta", seq}) add what is new. A board's store says what it holds (`reset`) and how a
// message goes in (`merge`, returning what changed); views subscribe to `views`.
class BoardStore {
  constructor(model) {
    this.model = model;
    this.views = new Set();
    this.seq = 0;
    this.reset();
    this.load(model.get("history"));
    model.on("change:history", () => this.load(model.get("history")));
    model.on("change:head", () => this.notify({ head: true }));
    model.on("msg:custom", (msg) => this.delta(msg));
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
function storeOf(model, Kind) {
  if (!stores.has(model)) stores.set(model, new Kind(model));
  return stores.get(model);
}

// -- a view's life: drawn at the store's news, redrawn on resize (and, for canvases, on a theme
// switch, whose colours they bake in); the theme is mirrored on the root; undone on removal ----
function follow(root, charts, store, draw, redraw, redrawOnTheme) {
  const resize = new ResizeObserver(() => redraw());
  resize.observe(charts);
  const theme = new MutationObserver(() => {
    if (redrawOnTheme) redraw();
    root.dataset.theme = document.body.dataset.jpThemeLight || "";
  });
  theme.observe(document.body, {
    attributes: true,
    attributeFilter: ["data-jp-theme-light"],
  });
  store.views.add(draw);
  draw({ all: true });
  return () => {
    store.views.delete(draw);
    resize.disconnect();
    theme.disconnect();
  };
}
