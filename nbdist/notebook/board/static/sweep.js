// nbdist's live board of a hyperparameter sweep, drawn by the browser (an anywidget ES module;
// no dependencies, SVG charts).
//
// The kernel (nbdist/notebook/sweeps/board.py) keeps the sweep's state and sends only what is new,
// a few times a second, as custom messages {kind: "delta", seq, loss, rate, rows}; a view starts
// from the synced `history` (everything so far, decimated) and the synced `head` (status, counts,
// the best trial). Curves are decimated here too (min and max per bucket, the rule of
// dashboard.js and curves.py). Everything that came from an engine or a user (trial values,
// notes, error lines, the title) is set as text, never as HTML.

const STATES = ["queued", "running", "done", "failed", "stopped"];
const COLUMNS = [
  ["trial", "trial"],
  ["label", "values"],
  ["state", "state"],
  ["ranks", "ranks"],
  ["step", "step"],
  ["loss", "loss"],
  ["best", "best loss"],
  ["samples_per_s", "samples/s"],
  ["note", "note"],
];
// matplotlib's tab10, as the final picture's "C0".."C9": a trial's colour is PALETTE[id % 10]
const LEGEND_MAX = 24; // trials named in the legend; the rest are counted
const SVG = "http://www.w3.org/2000/svg";

// Exponential moving average, debiased at the start (TensorBoard's smoothing), of a view.
function smoothed(v, weight) {
  if (!weight) return v;
  const y = [];
  let last = 0;
  for (let i = 0; i < v.y.length; i++) {
    last = last * weight + (1 - weight) * v.y[i];
    y.push(last / (1 - Math.pow(weight, i + 1)));
  }
  return { x: v.x, y };
}

// -- formatting -----------------------------------------------------------------------------
// Ticks of a log axis spanning 10^a .. 10^b: the powers of ten, or plain ticks within a decade.
function logTicks(a, b) {
  const step = Math.max(1, Math.ceil((Math.floor(b) - Math.ceil(a)) / 5));
  const out = [];
  for (let e = Math.ceil(a); e <= Math.floor(b); e += step) out.push(10 ** e);
  if (out.length >= 2) return out;
  return niceTicks(10 ** a, 10 ** b, 4).filter((t) => t > 0);
}
function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}
const colourOf = (trial) => PALETTE[((trial % 10) + 10) % 10];

// -- a line chart in SVG: one path per trial; its colours are CSS (the theme's variables) -----
class Chart {
  constructor(parent, title, opts = {}) {
    this.box = el("div", "nbs-chart");
    this.head = el("div", "nbs-chart-head");
    this.head.append(el("span", "nbs-chart-title", title));
    this.svg = svg("svg", { class: "nbs-plot", role: "img" });
    this.box.append(this.head, this.svg);
    parent.append(this.box);
    this.zeroBased = !!opts.zeroBased;
    this.log = false;
  }
  // lines: [{trial, v: {x, y}, state}]; highlight: a trial id or null
  draw(lines, highlight) {
    const w = Math.max(200, Math.round(this.svg.clientWidth || 400));
    const h = Math.max(120, Math.round(this.svg.clientHeight || 200));
    this.svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
    const log = this.log && lines.every((l) => l.v.y.every((y) => y > 0));
    const tf = log ? Math.log10 : (y) => y;
    lines = lines.filter((l) => l.v.x.length);
    const pad = { l: 52, r: 10, t: 8, b: 30 };
    const grid = svg("g", { class: "nbs-grid" });
    const axis = svg("g", { class: "nbs-axis" });
    const paths = svg("g", { class: "nbs-lines" });
    if (!lines.length) {
      axis.append(svg("text", { x: pad.l, y: h / 2 }, "waiting for points …"));
      this.svg.replaceChildren(grid, axis, paths);
      this.box.dataset.curves = "0";
      return;
    }
    let x0 = Infinity;
    let x1 = -Infinity;
    let y0 = Infinity;
    let y1 = -Infinity;
    for (const { v } of lines) {
      x0 = Math.min(x0, v.x[0]);
      x1 = Math.max(x1, v.x[v.x.length - 1]);
      for (const y of v.y) {
        y0 = Math.min(y0, tf(y));
        y1 = Math.max(y1, tf(y));
      }
    }
    if (this.zeroBased && !log) y0 = Math.min(0, y0);
    if (x1 === x0) x1 = x0 + 1;
    if (y1 === y0) {
      y1 += Math.abs(y1) * 0.05 || 1;
      y0 -= Math.abs(y0) * 0.05 || 1;
    }
    const span = y1 - y0;
    y1 += span * 0.04;
    if (!this.zeroBased || log) y0 -= span * 0.04;
    const X = (v) => pad.l + ((v - x0) / (x1 - x0)) * (w - pad.l - pad.r);
    const Y = (v) =>
      h - pad.b - ((tf(v) - y0) / (y1 - y0)) * (h - pad.t - pad.b);
    const yTicks = log ? logTicks(y0, y1) : niceTicks(y0, y1, 4);
    for (const t of yTicks) {
      const py = (Math.round(Y(t)) + 0.5).toFixed(1);
      grid.append(svg("line", { x1: pad.l, x2: w - pad.r, y1: py, y2: py }));
      axis.append(
        svg("text", { x: pad.l - 6, y: py, class: "nbs-ytick" }, fmt(t, 3)),
      );
    }
    for (const t of niceTicks(x0, x1, Math.max(2, Math.floor(w / 90)))) {
      axis.append(
        svg("text", { x: X(t), y: h - pad.b + 5, class: "nbs-xtick" }, fmt(t)),
      );
    }
    axis.append(
      svg("text", { x: w - pad.r, y: h - 3, class: "nbs-xlabel" }, "step"),
    );
    for (const l of lines) {
      let d = "";
      for (let i = 0; i < l.v.x.length; i++) {
        d += `${i ? "L" : "M"}${X(l.v.x[i]).toFixed(1)} ${Y(l.v.y[i]).toFixed(1)}`;
      }
      const cls = ["nbs-curve", "nbs-curve-" + l.state];
      if (highlight !== null)
        cls.push(l.trial === highlight ? "nbs-hi" : "nbs-lo");
      const path = svg("path", { d, class: cls.join(" ") });
      path.style.stroke = colourOf(l.trial);
      path.dataset.trial = String(l.trial);
      paths.append(path);
    }
    // the highlighted curve on top
    const top = [...paths.children].find((p) => p.classList.contains("nbs-hi"));
    if (top) paths.append(top);
    this.svg.replaceChildren(grid, axis, paths);
    this.box.dataset.curves = String(lines.length);
  }
}

// -- the sweep's state, one per model, shared by its views ----------------------------------
// Built in initialize(), before any view, so that deltas are not missed while no view exists.
class Store extends BoardStore {
  reset() {
    this.loss = new Map(); // trial -> Series
    this.rate = new Map();
    this.rows = new Map(); // trial -> row
    this.points = 0; // loss points received (the browser test reads it)
  }
  // A history's curves replace the store's ([xs, ys, stride]); a delta's are appended.
  merge(msg) {
    const changed = {};
    const whole = msg.kind === "history";
    for (const key of ["loss", "rate"]) {
      for (const [trial, pts] of Object.entries(msg[key] || {})) {
        const t = Number(trial);
        const [xs, ys, stride] = pts;
        if (whole) this[key].set(t, Series.of(xs, ys, stride));
        else {
          if (!this[key].has(t)) this[key].set(t, new Series());
          this[key].get(t).extend(xs, ys);
        }
        if (key === "loss") this.points += xs.length;
        changed[key] = true;
      }
    }
    for (const row of msg.rows || []) this.rows.set(row.trial, row);
    if (msg.rows && msg.rows.length) changed.rows = true;
    return changed;
  }
}

// -- a view -----------------------------------------------------------------------------------
function render({ model, el: root }) {
  const store = storeOf(model, Store);
  root.classList.add("nbs-board");
  let smoothing = 0;
  let highlight = null; // the trial under the pointer, in the legend or the table

  const head = el("div", "nbs-head");
  const title = el("span", "nbs-title");
  const badge = el("span", "nbs-badge");
  const counts = el("span", "nbs-counts");
  const stats = el("span", "nbs-stats");
  head.append(title, badge, counts, stats);
  const bestLine = el("div", "nbs-best-line");
  const charts = el("div", "nbs-charts");
  const lossChart = new Chart(charts, "loss per trial");
  const rateChart = new Chart(charts, "samples / s per trial", {
    zeroBased: true,
  });
  const controls = el("span", "nbs-controls");
  const slider = el("input");
  slider.type = "range";
  slider.min = "0";
  slider.max = "0.99";
  slider.step = "0.01";
  slider.value = String(smoothing);
  const sliderValue = el("span", "", slider.value);
  const logBox = el("input");
  logBox.type = "checkbox";
  const logLabel = el("label", "");
  logLabel.append(logBox, el("span", "", "log"));
  const smoothLabel = el("label", "");
  smoothLabel.append(el("span", "", "smoothing "), slider, sliderValue);
  controls.append(smoothLabel, logLabel);
  lossChart.head.append(controls);
  const legend = el("div", "nbs-legend");
  const table = el("table", "nbs-table");
  const hrow = el("tr");
  for (const [, label] of COLUMNS) hrow.append(el("th", "", label));
  const thead = el("thead");
  thead.append(hrow);
  const tbody = el("tbody");
  table.append(thead, tbody);
  const tableBox = el("div", "nbs-table-box");
  tableBox.append(table);
  root.append(head, bestLine, charts, legend, tableBox);

  const stateOf = (t) => (store.rows.get(t) || {}).state || "running";
  const trials = () =>
    [...new Set([...store.rows.keys(), ...store.loss.keys()])].sort(
      (a, b) => a - b,
    );

  function drawCharts() {
    const lines = (key, weight) =>
      [...store[key].keys()]
        .sort((a, b) => a - b)
        .map((t) => ({
          trial: t,
          state: stateOf(t),
          v: smoothed(store[key].get(t).view(), weight),
        }));
    lossChart.draw(lines("loss", smoothing), highlight);
    rateChart.draw(lines("rate", 0), highlight);
    root.dataset.curves = lossChart.box.dataset.curves;
  }

  function drawLegend() {
    legend.textContent = "";
    const ids = trials();
    for (const t of ids.slice(0, LEGEND_MAX)) {
      const row = store.rows.get(t);
      const key = el("span", `nbs-key nbs-key-${stateOf(t)}`);
      key.style.setProperty("--nbs-key", colourOf(t));
      key.append(el("span", "nbs-swatch"));
      key.append(el("span", "", `#${t} ${row ? row.label : ""}`));
      hover(key, t);
      legend.append(key);
    }
    if (ids.length > LEGEND_MAX)
      legend.append(el("span", "nbs-more", `+${ids.length - LEGEND_MAX} more`));
  }

  function drawHead() {
    const p = store.head();
    const status = p.status || "";
    title.textContent = p.title || "";
    badge.textContent = status;
    badge.className = "nbs-badge nbs-status-" + status;
    counts.textContent = "";
    for (const s of STATES) {
      const n = (p.counts || {})[s] || 0;
      if (n) counts.append(el("span", `nbs-count nbs-state-${s}`, `${n} ${s}`));
    }
    stats.textContent =
      p.elapsed !== undefined ? `${fmtSecs(p.elapsed)} elapsed` : "";
    const best = p.best === null || p.best === undefined ? null : p.best;
    const row = best === null ? null : store.rows.get(best);
    bestLine.textContent = row
      ? `best: #${best} ${row.label} · loss ${fmt(row.best)}`
      : "";
    root.dataset.status = status;
    root.dataset.best = best === null ? "" : String(best);
  }

  function drawRows() {
    const best = store.head().best;
    tbody.textContent = "";
    for (const t of [...store.rows.keys()].sort((a, b) => a - b)) {
      const row = store.rows.get(t);
      const tr = el("tr", "nbs-row-" + row.state);
      tr.dataset.trial = String(t);
      if (t === best) tr.classList.add("nbs-leader");
      if (t === highlight) tr.classList.add("nbs-hover");
      for (const [key] of COLUMNS) {
        const v = row[key];
        const td = el("td", "nbs-col-" + key);
        if (key === "trial") {
          const sw = el("span", "nbs-swatch");
          sw.style.setProperty("--nbs-key", colourOf(t));
          td.append(sw, el("span", "", `#${t}`));
          if (t === best) {
            const star = el("span", "nbs-star", "★ best");
            star.title = "lowest best loss";
            td.append(star);
          }
        } else if (key === "state") {
          td.append(el("span", "nbs-state nbs-state-" + v, v));
        } else if (key === "step") {
          td.textContent = fmtInt(v);
        } else if (key === "samples_per_s") {
          td.textContent = v === null || v === undefined ? "-" : fmtInt(v);
        } else if (key === "loss" || key === "best") {
          td.textContent = fmt(v);
        } else {
          td.textContent = v || (key === "note" ? "" : "-");
          if (key === "note" && v) td.title = v;
        }
        tr.append(td);
      }
      hover(tr, t);
      tbody.append(tr);
    }
    root.dataset.trials = String(store.rows.size);
  }

  function hover(node, trial) {
    node.addEventListener("mouseenter", () => setHighlight(trial));
    node.addEventListener("mouseleave", () => setHighlight(null));
  }
  function setHighlight(trial) {
    if (highlight === trial) return;
    highlight = trial;
    for (const tr of tbody.children)
      tr.classList.toggle("nbs-hover", tr.dataset.trial === String(trial));
    drawCharts();
  }

  let shownBest = null; // the best trial the table marks
  function draw(changed) {
    const best = store.head().best ?? null;
    if (changed.all || changed.head || changed.rows) drawHead();
    if (changed.all || changed.rows || best !== shownBest) {
      shownBest = best;
      drawRows();
    }
    if (changed.all || changed.rows || changed.loss) drawLegend();
    if (changed.all || changed.rows || changed.loss || changed.rate)
      drawCharts();
    root.dataset.points = String(store.points);
  }

  slider.addEventListener("input", () => {
    smoothing = Number(slider.value);
    sliderValue.textContent = slider.value;
    drawCharts();
  });
  logBox.addEventListener("change", () => {
    lossChart.log = logBox.checked;
    drawCharts();
  });
  root.addEventListener("mouseleave", () => setHighlight(null));
  // SVG colours are CSS variables, so a theme switch needs no redraw; the test reads the theme
  return follow(root, charts, store, draw, drawCharts, false);
}

export default {
  initialize({ model }) {
    storeOf(model, Store);
  },
  render,
};
