// nbdist's live dashboard of one run, drawn by the browser (an anywidget ES module, bundled with
// what it imports by extension/build-boards.mjs; nothing is fetched at run time).
//
// The kernel (nbdist/notebook/board/dashboard.py) keeps the run's state and sends only what is
// new, a few times a second, as custom messages {kind: "delta", seq, ...}; a view starts from the
// synced `history` (everything so far, decimated) and `head` (progress, status). Every metric
// passed to report() has a chart: loss on top, beside samples/s, the others in a grid below, each
// per rank and their mean, sharing the step axis and the cursor. Curves are decimated here too
// (min and max per bucket), so a run of a million steps costs the browser what a run of a
// thousand does. Everything that came from an engine (host names, log lines, messages, metric
// names) is set as text, never as HTML.

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

const COLUMNS = [
  ["rank", "rank"],
  ["host", "host"],
  ["state", "state"],
  ["steps", "steps"],
  ["loss", "loss"],
  ["step_ms", "step ms"],
  ["cpu", "cpu %"],
  ["rss_mb", "rss MB"],
  ["gpu_util", "gpu %"],
  ["gpu_mb", "gpu MB"],
  ["comm", "comm %"],
  ["pp", "pp"],
  ["dp", "dp"],
  ["tp", "tp"],
  ["stage", "stage"],
  ["idle", "idle %"],
  ["quiet", "quiet s"],
];
// Columns shown only when some rank has a value: its coordinates in a mesh (nbdist.mesh: "0/2"
// along each dimension), a pipeline's stage and its idle (bubble) share.
const MESH = ["pp", "dp", "tp"];
const OPTIONAL = new Set([...MESH, "stage", "idle"]);
const TEXT = new Set(["host", "state", "stage"]);
const TITLES = {
  pp: "its stage along the mesh's pp dimension (nbdist.mesh): index / size",
  dp: "its replica along the mesh's dp dimension (nbdist.mesh): index / size",
  tp: "its shard along the mesh's tp dimension (nbdist.mesh): index / size",
};
const WHOLE = new Set(["rank", "steps", "quiet"]);
// Beyond this many ranks a chart draws their mean alone (the table has every rank).
const RANK_LINES = 16;
// A profiled step's parts, as nbdist/notebook/debug/profile.py names them
const PARTS = [
  ["compute_ms", "computing"],
  ["comm_ms", "communicating"],
  ["data_ms", "data loading"],
  ["wait_ms", "waiting"],
];

// -- the run's state, one per model, shared by its views ------------------------------------
// Built in initialize(), before any view, so that deltas are not missed while no view exists.
class Store extends BoardStore {
  reset() {
    this.metrics = new Map(); // name -> {ranks: Map(rank -> Series), mean: Series}
    this.rate = new Series();
    this.rows = new Map(); // rank -> row
    this.events = [];
    this.logs = new Map(); // rank -> [lines]
    this.profile = null; // where a step's time went on each rank (--profile), at the end
    this.points = 0; // loss points received (the browser test reads it)
  }
  // A history's curves replace the store's ([xs, ys, stride]); a delta's are appended.
  merge(msg) {
    const changed = {};
    const whole = msg.kind === "history";
    const into = (series, [xs, ys, stride]) => {
      if (whole) return Series.of(xs, ys, stride);
      series.extend(xs, ys);
      return series;
    };
    for (const [name, m] of Object.entries(msg.metrics || {})) {
      let cur = this.metrics.get(name);
      if (!cur) {
        cur = { ranks: new Map(), mean: new Series() };
        this.metrics.set(name, cur);
      }
      for (const [rank, pts] of Object.entries(m.ranks || {})) {
        const r = Number(rank);
        cur.ranks.set(r, into(cur.ranks.get(r) || new Series(), pts));
        if (name === "loss") this.points += pts[0].length;
      }
      if (m.mean) cur.mean = into(cur.mean, m.mean);
      (changed.metrics ||= new Set()).add(name);
    }
    if (msg.rate) {
      this.rate = into(this.rate, msg.rate);
      changed.rate = true;
    }
    for (const row of msg.rows || []) this.rows.set(row.rank, row);
    if (msg.rows && msg.rows.length) changed.rows = true;
    if (msg.events && msg.events.length) {
      this.events = this.events.concat(msg.events).slice(-50);
      changed.events = true;
    }
    if (whole) this.logs.clear();
    for (const [rank, lines] of Object.entries(msg.logs || {}))
      this.logs.set(Number(rank), lines);
    if (msg.logs || whole) changed.logs = true;
    if (whole) {
      this.profile = msg.profile || null;
      changed.profile = true;
    }
    return changed;
  }
  // The metrics other than loss, in the order they were first reported.
  others() {
    return [...this.metrics.keys()].filter((name) => name !== "loss");
  }
}

// -- a view -----------------------------------------------------------------------------------
function render({ model, el: root }) {
  const store = storeOf(model, Store);
  root.classList.add("nbd-dashboard");
  const sync = `nbd-${Math.random().toString(36).slice(2)}`; // this view's charts share a cursor
  let smoothing = 0.6;
  let logRank = null;

  const head = el("div", "nbd-head");
  const title = el("span", "nbd-title");
  const badge = el("span", "nbd-badge");
  const stats = el("span", "nbd-stats");
  head.append(title, badge, stats);
  const bar = el("div", "nbd-bar");
  const fill = el("div", "nbd-bar-fill");
  bar.append(fill);
  const controls = el("label", "nbd-smooth");
  const slider = el("input");
  slider.type = "range";
  slider.min = "0";
  slider.max = "0.99";
  slider.step = "0.01";
  slider.value = String(smoothing);
  const sliderValue = el("span", "", slider.value);
  controls.append(el("span", "", "smoothing "), slider, sliderValue);
  const charts = el("div", "nbd-charts");
  const lossChart = new MetricChart(charts, {
    title: "loss per rank, and their mean",
    sync,
    height: 190,
    empty: "waiting for report(loss=…)",
  });
  lossChart.node.dataset.metric = "loss";
  const rateChart = new MetricChart(charts, {
    title: "samples / s",
    xLabel: "seconds",
    height: 190,
    zeroBased: true,
    empty: "waiting for report(samples=…)",
  });
  const grid = new ChartGrid(el("div"), { sync, height: 130 });
  grid.node.classList.add("nbd-metrics");
  const table = el("table", "nbd-table");
  const thead = el("thead");
  const hrow = el("tr");
  thead.append(hrow);
  const tbody = el("tbody");
  table.append(thead, tbody);
  const tableBox = el("div", "nbd-table-box");
  tableBox.append(table);
  const profileBox = el("div", "nbd-profile");
  const bottom = el("div", "nbd-bottom");
  const eventsBox = el("div", "nbd-events");
  const logBox = el("div", "nbd-logs");
  const logHead = el("div", "nbd-log-head");
  const logSelect = el("select");
  logHead.append(el("span", "", "last lines of "), logSelect);
  const logText = el("pre", "nbd-log-text");
  logBox.append(logHead, logText);
  bottom.append(eventsBox, logBox);
  root.append(
    head,
    bar,
    controls,
    charts,
    grid.node,
    profileBox,
    tableBox,
    bottom,
  );

  // A metric's lines: each rank's (while there are few) and their mean, smoothed alike.
  function linesOf(name) {
    const m = store.metrics.get(name);
    if (!m) return [];
    const ranks = [...m.ranks.keys()].sort((a, b) => a - b);
    const line = (label, series, colour, width, alpha) => {
      const v = series.view();
      return { label, x: v.x, y: smooth(v.y, smoothing), colour, width, alpha };
    };
    const out =
      ranks.length > RANK_LINES
        ? []
        : ranks.map((r, i) =>
            line(`rank ${r}`, m.ranks.get(r), PALETTE[i % 10], 1, 0.75),
          );
    if (ranks.length > 1 || !out.length) {
      out.push(line("mean", m.mean, "strong", 2, 0.9));
    }
    return out;
  }

  function drawCharts(changed) {
    const names = changed.all ? null : changed.metrics;
    if (!names || names.has("loss")) lossChart.setLines(linesOf("loss"));
    grid.draw(store.others(), linesOf, names);
    root.dataset.charts = String(1 + grid.charts.size);
  }

  function drawRate() {
    const v = store.rate.view();
    rateChart.setLines([
      { label: "samples/s", x: v.x, y: v.y, colour: "#1565c0", width: 1.5 },
    ]);
  }

  function drawHead() {
    const p = store.head();
    const status = p.status || "";
    title.textContent = p.title || "";
    badge.textContent = status;
    badge.className = "nbd-badge nbd-status-" + status.split(" ")[0];
    const parts = [];
    if (p.steps !== undefined && p.steps !== null) {
      parts.push(
        p.total
          ? `${fmtInt(p.steps)} / ${fmtInt(p.total)} steps`
          : `${fmtInt(p.steps)} steps`,
      );
      if (p.total)
        parts.push(
          `${((100 * Math.min(p.steps, p.total)) / p.total).toFixed(1)} %`,
        );
    }
    if (p.eta !== null && p.eta !== undefined)
      parts.push(`ETA ${fmtDuration(p.eta)}`);
    if (p.rate !== null && p.rate !== undefined)
      parts.push(`${fmtInt(p.rate)} samples/s`);
    if (p.mean_loss !== null && p.mean_loss !== undefined)
      parts.push(`loss ${fmt(p.mean_loss)}`);
    if (p.elapsed !== undefined) parts.push(fmtDuration(p.elapsed));
    stats.textContent = parts.join(" · ");
    const share = p.total && p.steps ? Math.min(1, p.steps / p.total) : 0;
    fill.style.width = `${(100 * share).toFixed(2)}%`;
    bar.style.display = p.total ? "" : "none";
    root.dataset.status = status;
  }

  function drawRows() {
    const rows = [...store.rows.values()].sort((a, b) => a.rank - b.rank);
    const columns = COLUMNS.filter(
      ([key]) => !OPTIONAL.has(key) || rows.some((row) => row[key] != null),
    );
    // one format per column: 0.001658 never stands beside 2.90e-4
    const formats = new Map(
      columns.map(([key]) => [
        key,
        WHOLE.has(key)
          ? fmtInt
          : columnFormat(
              rows.map((row) =>
                typeof row[key] === "number" ? row[key] : null,
              ),
            ),
      ]),
    );
    hrow.textContent = "";
    for (const [key, label] of columns) {
      const th = el("th", "", label);
      if (TITLES[key]) th.title = TITLES[key];
      hrow.append(th);
    }
    tbody.textContent = "";
    for (const row of rows) {
      const tr = el("tr", "nbd-row-" + row.state);
      tr.dataset.rank = String(row.rank);
      for (const [key] of columns) {
        const v = row[key];
        if (key === "state") {
          const td = el("td");
          const state = el("span", "nbd-state nbd-state-" + v, v);
          if (row.error) state.title = row.error;
          td.append(state);
          tr.append(td);
        } else if (MESH.includes(key)) {
          const td = el("td", "nbd-num nbd-mesh", v || MISSING);
          td.dataset.dim = key;
          tr.append(td);
        } else if (TEXT.has(key)) {
          tr.append(el("td", "nbd-" + key, v || MISSING));
        } else {
          const text = typeof v === "string" ? v : formats.get(key)(v);
          tr.append(el("td", "nbd-num", text));
        }
      }
      tbody.append(tr);
    }
    root.dataset.ranks = String(rows.length);
  }

  function drawEvents() {
    eventsBox.textContent = "";
    eventsBox.append(el("div", "nbd-section", "events"));
    if (!store.events.length)
      eventsBox.append(el("div", "nbd-quiet", "none yet"));
    for (const e of store.events.slice(-8)) {
      const line = el("div", "nbd-event nbd-event-" + e.kind);
      const who =
        e.rank === null || e.rank === undefined ? "" : `rank ${e.rank}: `;
      line.append(
        el("span", "nbd-event-kind", e.kind),
        el("span", "", ` ${who}${e.message}`),
      );
      eventsBox.append(line);
    }
  }

  // The last lines of the ranks whose output is not shown under the cell (each line once).
  function drawLogs() {
    const ranks = [...store.logs.keys()].sort((a, b) => a - b);
    logBox.style.display = ranks.length ? "" : "none";
    if (logSelect.options.length !== ranks.length) {
      logSelect.textContent = "";
      for (const r of ranks) {
        const o = el("option", "", `rank ${r}`);
        o.value = String(r);
        logSelect.append(o);
      }
    }
    if ((logRank === null || !store.logs.has(logRank)) && ranks.length)
      logRank = ranks[0];
    if (logRank !== null) logSelect.value = String(logRank);
    const lines = store.logs.get(logRank) || [];
    logText.textContent = lines.length ? lines.join("\n") : "(no output yet)";
  }

  // --profile: a bar per rank, its step split into computing, communicating, data, waiting
  function drawProfile() {
    const p = store.profile;
    profileBox.textContent = "";
    profileBox.style.display = p ? "" : "none";
    if (!p) return;
    profileBox.append(
      el("div", "nbd-section", "where a step's time goes (ms per step)"),
    );
    const widest = Math.max(...p.rows.map((r) => r.step_ms), 1e-9);
    for (const r of p.rows) {
      const line = el("div", "nbd-profile-row");
      line.dataset.rank = String(r.rank);
      if (r.rank === p.straggler) line.classList.add("nbd-straggler");
      const bar = el("div", "nbd-profile-bar");
      for (const [key, label] of PARTS) {
        const part = el("span", "nbd-part nbd-part-" + key);
        part.style.width = `${(100 * r[key]) / widest}%`;
        part.title = `${label} ${fmt(r[key])} ms`;
        bar.append(part);
      }
      line.append(
        el("span", "nbd-profile-rank", `rank ${r.rank}`),
        bar,
        el("span", "nbd-num", `${fmt(r.step_ms)} ms`),
      );
      profileBox.append(line);
    }
    const legend = el("div", "nbd-profile-legend");
    for (const [key, label] of PARTS) {
      const item = el("span", "nbd-key");
      item.append(
        el("span", "nbd-part nbd-part-" + key),
        el("span", "", label),
      );
      legend.append(item);
    }
    profileBox.append(legend, el("div", "nbd-profile-reason", p.reason));
  }

  function draw(changed) {
    if (changed.all || changed.head) drawHead();
    if (changed.all || changed.metrics) drawCharts(changed);
    if (changed.all || changed.rate) drawRate();
    if (changed.all || changed.rows) drawRows();
    if (changed.all || changed.events) drawEvents();
    if (changed.all || changed.logs) drawLogs();
    if (changed.all || changed.profile) drawProfile();
    root.dataset.points = String(store.points);
  }

  slider.addEventListener("input", () => {
    smoothing = Number(slider.value);
    sliderValue.textContent = slider.value;
    drawCharts({ all: true });
  });
  logSelect.addEventListener("change", () => {
    logRank = Number(logSelect.value);
    drawLogs();
  });
  return follow(root, store, draw, () => {
    lossChart.destroy();
    rateChart.destroy();
    grid.destroy();
  });
}

// for the tests (tests/unit/test_dashboard_js.py, tests/unit/test_format.py)
export { Series, columnFormat, fmt, fmtDuration, fmtInt };

export default {
  initialize({ model }) {
    storeOf(model, Store);
  },
  render,
};
