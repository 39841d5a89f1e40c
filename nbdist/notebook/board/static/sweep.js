// nbdist's live board of a hyperparameter sweep, drawn by the browser (an anywidget ES module,
// bundled with what it imports by extension/build-boards.mjs; nothing is fetched at run time).
//
// The kernel (nbdist/notebook/sweeps/board.py) keeps the sweep's state and sends only what is new,
// a few times a second, as custom messages {kind: "delta", seq, metrics, rows}; a view starts
// from the synced `history` (everything so far, decimated) and the synced `head` (status, counts,
// the best trial). Every metric the trials report has a chart with one curve per trial (loss and
// samples/s on top, the others in a grid), decimated here by the kernel's rule. Everything that
// came from an engine or a user (trial values, notes, error lines, the title) is set as text.

import { MetricChart, smooth } from "@nbdist/chart";
import {
  MISSING,
  columnFormat,
  fmt,
  fmtDuration,
  fmtInt,
} from "@nbdist/format";
import {
  BoardStore,
  ChartGrid,
  PALETTE,
  Series,
  el,
  follow,
  storeOf,
} from "./common.js";

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
const RATE = "samples/s"; // the kernel's name of a trial's throughput curve
const LEGEND_MAX = 24; // trials named in the legend; the rest are counted
// matplotlib's tab10, as the final picture's "C0".."C9": a trial's colour is PALETTE[id % 10]
const colourOf = (trial) => PALETTE[((trial % 10) + 10) % 10];
const DASHES = { stopped: [6, 4], failed: [2, 3] };

// -- the sweep's state, one per model, shared by its views ----------------------------------
// Built in initialize(), before any view, so that deltas are not missed while no view exists.
class Store extends BoardStore {
  reset() {
    this.metrics = new Map(); // name -> Map(trial -> Series)
    this.rows = new Map(); // trial -> row
    this.points = 0; // loss points received (the browser test reads it)
  }
  // A history's curves replace the store's ([xs, ys, stride]); a delta's are appended.
  merge(msg) {
    const changed = {};
    const whole = msg.kind === "history";
    for (const [name, trials] of Object.entries(msg.metrics || {})) {
      if (!this.metrics.has(name)) this.metrics.set(name, new Map());
      const curves = this.metrics.get(name);
      for (const [trial, [xs, ys, stride]] of Object.entries(trials)) {
        const t = Number(trial);
        if (whole) curves.set(t, Series.of(xs, ys, stride));
        else if (!curves.has(t)) curves.set(t, Series.of([], []));
        if (!whole) curves.get(t).extend(xs, ys);
        if (name === "loss") this.points += xs.length;
      }
      (changed.metrics ||= new Set()).add(name);
    }
    for (const row of msg.rows || []) this.rows.set(row.trial, row);
    if (msg.rows && msg.rows.length) changed.rows = true;
    return changed;
  }
  others() {
    return [...this.metrics.keys()].filter((n) => n !== "loss" && n !== RATE);
  }
}

// -- a view -----------------------------------------------------------------------------------
function render({ model, el: root }) {
  const store = storeOf(model, Store);
  root.classList.add("nbs-board");
  const sync = `nbs-${Math.random().toString(36).slice(2)}`; // this view's step axes
  let smoothing = 0;
  let highlight = null; // the trial under the pointer, in the legend or the table

  const head = el("div", "nbs-head");
  const title = el("span", "nbs-title");
  const badge = el("span", "nbs-badge");
  const counts = el("span", "nbs-counts");
  const stats = el("span", "nbs-stats");
  head.append(title, badge, counts, stats);
  const bestLine = el("div", "nbs-best-line");
  const controls = el("label", "nbs-controls");
  const slider = el("input");
  slider.type = "range";
  slider.min = "0";
  slider.max = "0.99";
  slider.step = "0.01";
  slider.value = String(smoothing);
  const sliderValue = el("span", "", slider.value);
  controls.append(el("span", "", "smoothing "), slider, sliderValue);
  const charts = el("div", "nbs-charts");
  const lossChart = new MetricChart(charts, {
    title: "loss per trial",
    sync,
    height: 200,
    empty: "waiting for points …",
  });
  lossChart.node.dataset.metric = "loss";
  const rateChart = new MetricChart(charts, {
    title: "samples / s per trial",
    sync,
    height: 200,
    zeroBased: true,
    empty: "waiting for points …",
  });
  const grid = new ChartGrid(el("div"), { sync, height: 130 });
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
  root.append(head, bestLine, controls, charts, grid.node, legend, tableBox);

  const stateOf = (t) => (store.rows.get(t) || {}).state || "running";
  const labelOf = (t) => `#${t} ${(store.rows.get(t) || {}).label || ""}`;
  const trials = () => {
    const ids = new Set(store.rows.keys());
    for (const curves of store.metrics.values())
      for (const t of curves.keys()) ids.add(t);
    return [...ids].sort((a, b) => a - b);
  };

  // A metric's lines: one per trial, coloured by trial, dashed when it did not end well.
  function linesOf(name) {
    const curves = store.metrics.get(name) || new Map();
    const weight = name === RATE ? 0 : smoothing;
    return [...curves.keys()]
      .sort((a, b) => a - b)
      .map((t) => {
        const v = curves.get(t).view();
        return {
          label: labelOf(t),
          x: v.x,
          y: smooth(v.y, weight),
          colour: colourOf(t),
          width: 1.2,
          alpha: stateOf(t) === "failed" ? 0.5 : 0.9,
          dash: DASHES[stateOf(t)],
        };
      });
  }

  function drawCharts(changed) {
    const names = changed.all || changed.rows ? null : changed.metrics;
    if (!names || names.has("loss")) lossChart.setLines(linesOf("loss"));
    if (!names || names.has(RATE)) rateChart.setLines(linesOf(RATE));
    grid.draw(store.others(), linesOf, names);
    focus();
    const loss = store.metrics.get("loss");
    root.dataset.curves = String(loss ? loss.size : 0);
    root.dataset.charts = String(2 + grid.charts.size);
  }

  function focus() {
    const label = highlight === null ? null : labelOf(highlight);
    for (const chart of [lossChart, rateChart, ...grid.charts.values()])
      chart.focus(label);
  }

  function drawLegend() {
    legend.textContent = "";
    const ids = trials();
    for (const t of ids.slice(0, LEGEND_MAX)) {
      const key = el("span", `nbs-key nbs-key-${stateOf(t)}`);
      key.style.setProperty("--nbs-key", colourOf(t));
      key.append(el("span", "nbs-swatch"), el("span", "", labelOf(t)));
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
    stats.textContent = p.elapsed !== undefined ? fmtDuration(p.elapsed) : "";
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
    const rows = [...store.rows.values()].sort((a, b) => a.trial - b.trial);
    const lossFormat = columnFormat(
      rows
        .flatMap((r) => [r.loss, r.best])
        .filter((v) => typeof v === "number"),
    );
    tbody.textContent = "";
    for (const row of rows) {
      const t = row.trial;
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
        } else if (key === "step" || key === "samples_per_s") {
          td.textContent = fmtInt(v);
        } else if (key === "loss" || key === "best") {
          td.textContent = typeof v === "string" ? v : lossFormat(v);
        } else {
          td.textContent = v || (key === "note" ? "" : MISSING);
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
    focus();
  }

  let shownBest = null; // the best trial the table marks
  function draw(changed) {
    const best = store.head().best ?? null;
    if (changed.all || changed.head || changed.rows) drawHead();
    if (changed.all || changed.rows || best !== shownBest) {
      shownBest = best;
      drawRows();
    }
    if (changed.all || changed.rows || changed.metrics) {
      drawLegend();
      drawCharts(changed);
    }
    root.dataset.points = String(store.points);
  }

  slider.addEventListener("input", () => {
    smoothing = Number(slider.value);
    sliderValue.textContent = slider.value;
    drawCharts({ all: true });
  });
  root.addEventListener("mouseleave", () => setHighlight(null));
  return follow(root, store, draw, () => {
    lossChart.destroy();
    rateChart.destroy();
    grid.destroy();
  });
}

export default {
  initialize({ model }) {
    storeOf(model, Store);
  },
  render,
};
