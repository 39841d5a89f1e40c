// nbdist's live dashboard, drawn by the browser (an anywidget ES module; no dependencies).
//
// The kernel keeps the run's state and sends only what is new, a few times a second, as custom
// messages: {kind: "delta", ...}. A view that renders asks for everything once ({kind: "hello"}),
// and the kernel answers {kind: "snapshot", ...}. Curves are decimated here too (min and max per
// bucket), so a run of a million steps costs the browser what a run of a thousand does.
// Everything that came from an engine (host names, log lines, messages) is set as text, never
// as HTML.

const STATES = ["ok", "slow", "silent", "dead"];
const COLUMNS = [
  ["rank", "rank"],
  ["host", "host"],
  ["state", "state"],
  ["step", "step"],
  ["loss", "loss"],
  ["step_ms", "step ms"],
  ["cpu", "cpu %"],
  ["rss_mb", "rss MB"],
  ["gpu_util", "gpu %"],
  ["gpu_mb", "gpu MB"],
  ["comm", "comm %"],
  ["stage", "stage"],
  ["idle", "idle %"],
  ["quiet", "quiet s"],
];
// Columns shown only when some rank has a value: a pipeline's stage and its idle (bubble) share.
const OPTIONAL = new Set(["stage", "idle"]);

// -- a line chart on a canvas, crisp at any pixel ratio, coloured by the page's theme --------
class Chart {
  constructor(parent, title, xLabel) {
    this.box = el("div", "nbd-chart");
    this.head = el("div", "nbd-chart-head");
    this.head.append(el("span", "nbd-chart-title", title));
    this.legend = el("span", "nbd-legend");
    this.head.append(this.legend);
    this.canvas = el("canvas");
    this.box.append(this.head, this.canvas);
    parent.append(this.box);
    this.xLabel = xLabel;
    this.lines = []; // {series, colour, width, alpha, label}
    this.dirty = true;
  }
  colours() {
    const css = getComputedStyle(this.box);
    return {
      text: css.getPropertyValue("--jp-ui-font-color2").trim() || "#616161",
      grid: css.getPropertyValue("--jp-border-color2").trim() || "#e0e0e0",
      strong: css.getPropertyValue("--jp-ui-font-color0").trim() || "#000",
    };
  }
  draw() {
    const dpr = window.devicePixelRatio || 1;
    const w = this.canvas.clientWidth || 300;
    const h = this.canvas.clientHeight || 180;
    if (
      this.canvas.width !== Math.round(w * dpr) ||
      this.canvas.height !== Math.round(h * dpr)
    ) {
      this.canvas.width = Math.round(w * dpr);
      this.canvas.height = Math.round(h * dpr);
    }
    const ctx = this.canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    const c = this.colours();
    const lines = this.lines
      .filter((l) => l.series.length)
      .map((l) => ({ ...l, v: l.series.view() }));
    const pad = { l: 52, r: 10, t: 6, b: 26 };
    ctx.font = "11px var(--jp-ui-font-family, sans-serif)";
    ctx.fillStyle = c.text;
    if (!lines.length) {
      ctx.fillText("waiting for report() …", pad.l, h / 2);
      return;
    }
    let x0 = Infinity,
      x1 = -Infinity,
      y0 = Infinity,
      y1 = -Infinity;
    for (const l of lines) {
      const s = l.v;
      x0 = Math.min(x0, s.x[0]);
      x1 = Math.max(x1, s.x[s.x.length - 1]);
      for (const v of s.y) {
        if (v < y0) y0 = v;
        if (v > y1) y1 = v;
      }
    }
    if (this.zeroBased) y0 = Math.min(0, y0);
    if (x1 === x0) x1 = x0 + 1;
    if (y1 === y0) {
      y1 += Math.abs(y1) * 0.05 || 1;
      y0 -= Math.abs(y0) * 0.05 || 1;
    }
    const span = y1 - y0;
    y1 += span * 0.04;
    if (!this.zeroBased) y0 -= span * 0.04;
    const X = (v) => pad.l + ((v - x0) / (x1 - x0)) * (w - pad.l - pad.r);
    const Y = (v) => h - pad.b - ((v - y0) / (y1 - y0)) * (h - pad.t - pad.b);
    ctx.strokeStyle = c.grid;
    ctx.lineWidth = 1;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (const t of niceTicks(y0, y1, 4)) {
      const py = Math.round(Y(t)) + 0.5;
      ctx.beginPath();
      ctx.moveTo(pad.l, py);
      ctx.lineTo(w - pad.r, py);
      ctx.stroke();
      ctx.fillText(fmt(t, 3), pad.l - 6, py);
    }
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    for (const t of niceTicks(x0, x1, Math.max(2, Math.floor(w / 90)))) {
      ctx.fillText(fmt(t, 4), X(t), h - pad.b + 5);
    }
    ctx.textAlign = "right";
    ctx.fillText(this.xLabel, w - pad.r, h - 12);
    for (const l of lines) {
      const s = l.v;
      ctx.globalAlpha = l.alpha;
      ctx.strokeStyle = l.colour === "strong" ? c.strong : l.colour;
      ctx.lineWidth = l.width;
      ctx.beginPath();
      for (let i = 0; i < s.x.length; i++) {
        const px = X(s.x[i]);
        const py = Y(s.y[i]);
        if (i === 0) ctx.moveTo(px, py);
        else ctx.lineTo(px, py);
      }
      ctx.stroke();
      ctx.globalAlpha = 1;
    }
    this.dirty = false;
  }
}

// Exponential moving average, as TensorBoard's smoothing slider does (debiased at the start).
function smoothed(series, weight) {
  if (!weight) return series;
  const v = series.view();
  const ys = [];
  let last = 0;
  for (let i = 0; i < v.y.length; i++) {
    last = last * weight + (1 - weight) * v.y[i];
    ys.push(last / (1 - Math.pow(weight, i + 1)));
  }
  return Series.of(v.x, ys, series.stride);
}

// -- the run's state, one per model, shared by its views ------------------------------------
// Built in initialize(), before any view, so that deltas are not missed while no view exists.
class Store extends BoardStore {
  reset() {
    this.loss = new Map(); // rank -> Series
    this.mean = new Series();
    this.rate = new Series();
    this.rows = new Map(); // rank -> row
    this.events = [];
    this.logs = new Map(); // rank -> [lines]
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
    for (const [rank, pts] of Object.entries(msg.loss || {})) {
      const r = Number(rank);
      this.loss.set(r, into(this.loss.get(r) || new Series(), pts));
      this.points += pts[0].length;
      changed.loss = true;
    }
    if (msg.mean) {
      this.mean = into(this.mean, msg.mean);
      changed.loss = true;
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
    for (const [rank, lines] of Object.entries(msg.logs || {}))
      this.logs.set(Number(rank), lines);
    if (msg.logs) changed.logs = true;
    return changed;
  }
}

// -- a view -----------------------------------------------------------------------------------
function render({ model, el: root }) {
  const store = storeOf(model, Store);
  root.classList.add("nbd-dashboard");
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
  const charts = el("div", "nbd-charts");
  const lossChart = new Chart(charts, "loss per rank, and their mean", "step");
  const rateChart = new Chart(charts, "samples / s", "seconds");
  rateChart.zeroBased = true;
  const controls = el("label", "nbd-smooth");
  const slider = el("input");
  slider.type = "range";
  slider.min = "0";
  slider.max = "0.99";
  slider.step = "0.01";
  slider.value = String(smoothing);
  const sliderValue = el("span", "", slider.value);
  controls.append(el("span", "", "smoothing "), slider, sliderValue);
  lossChart.head.append(controls);
  const table = el("table", "nbd-table");
  const thead = el("thead");
  const hrow = el("tr");
  thead.append(hrow);
  const tbody = el("tbody");
  table.append(thead, tbody);
  const tableBox = el("div", "nbd-table-box");
  tableBox.append(table);
  const bottom = el("div", "nbd-bottom");
  const eventsBox = el("div", "nbd-events");
  const logBox = el("div", "nbd-logs");
  const logHead = el("div", "nbd-log-head");
  const logSelect = el("select");
  logHead.append(el("span", "", "last lines of "), logSelect);
  const logText = el("pre", "nbd-log-text");
  logBox.append(logHead, logText);
  bottom.append(eventsBox, logBox);
  root.append(head, bar, charts, tableBox, bottom);

  function drawLoss() {
    const ranks = [...store.loss.keys()].sort((a, b) => a - b);
    const many = ranks.length > 8;
    lossChart.lines = ranks.map((r, i) => ({
      series: smoothed(store.loss.get(r), smoothing),
      colour: PALETTE[i % PALETTE.length],
      width: 1,
      alpha: many ? 0.3 : 0.75,
    }));
    lossChart.lines.push({
      series: smoothed(store.mean, smoothing),
      colour: "strong",
      width: 2,
      alpha: 0.9,
    });
    lossChart.legend.textContent = "";
    const key = (text, colour) => {
      const item = el("span", "nbd-key", text);
      if (colour) item.style.setProperty("--nbd-key", colour);
      lossChart.legend.append(item);
    };
    if (many) key(`${ranks.length} ranks`, null);
    else ranks.forEach((r, i) => key(`rank ${r}`, PALETTE[i % PALETTE.length]));
    if (ranks.length) key("mean", "var(--jp-ui-font-color0, #000)");
    lossChart.draw();
  }

  function drawRate() {
    rateChart.lines = [
      { series: store.rate, colour: "#1565c0", width: 1.5, alpha: 1 },
    ];
    rateChart.draw();
  }

  function drawHead() {
    const p = store.head();
    const status = p.status || "";
    title.textContent = p.title || "";
    badge.textContent = status;
    badge.className = "nbd-badge nbd-status-" + status.split(" ")[0];
    const parts = [];
    if (p.step !== undefined && p.step !== null) {
      parts.push(
        p.total
          ? `step ${fmtInt(p.step)} / ${fmtInt(p.total)}`
          : `step ${fmtInt(p.step)}`,
      );
    }
    if (p.total && p.done !== null && p.done !== undefined) {
      parts.push(
        `${((100 * Math.min(p.done, p.total)) / p.total).toFixed(1)} %`,
      );
    }
    if (p.eta !== null && p.eta !== undefined)
      parts.push(`ETA ${fmtSecs(p.eta)}`);
    if (p.rate !== null && p.rate !== undefined)
      parts.push(`${fmtInt(p.rate)} samples/s`);
    if (p.mean_loss !== null && p.mean_loss !== undefined)
      parts.push(`loss ${fmt(p.mean_loss)}`);
    if (p.elapsed !== undefined) parts.push(`${fmtSecs(p.elapsed)} elapsed`);
    stats.textContent = parts.join(" · ");
    const share = p.total && p.done ? Math.min(1, p.done / p.total) : 0;
    fill.style.width = `${(100 * share).toFixed(2)}%`;
    bar.style.display = p.total ? "" : "none";
    root.dataset.status = status;
  }

  function drawRows() {
    const ranks = [...store.rows.keys()].sort((a, b) => a - b);
    const columns = COLUMNS.filter(
      ([key]) =>
        !OPTIONAL.has(key) || ranks.some((r) => store.rows.get(r)[key] != null),
    );
    hrow.textContent = "";
    for (const [, label] of columns) hrow.append(el("th", "", label));
    tbody.textContent = "";
    for (const r of ranks) {
      const row = store.rows.get(r);
      const tr = el("tr", "nbd-row-" + row.state);
      for (const [key] of columns) {
        const v = row[key];
        if (key === "state") {
          const td = el("td");
          td.append(el("span", "nbd-state nbd-state-" + v, v));
          tr.append(td);
        } else if (key === "host") {
          tr.append(el("td", "nbd-host", v || "?"));
        } else if (key === "stage") {
          tr.append(el("td", "nbd-num", v ?? "–"));
        } else if (key === "loss") {
          tr.append(el("td", "nbd-num", typeof v === "string" ? v : fmt(v)));
        } else {
          tr.append(
            el(
              "td",
              "nbd-num",
              key === "rank" || key === "step" ? fmtInt(v) : fmt(v, 3),
            ),
          );
        }
      }
      tbody.append(tr);
    }
    const counts = STATES.map((s) => [
      s,
      ranks.filter((r) => store.rows.get(r).state === s).length,
    ]);
    table.title = counts.map(([s, n]) => `${s}: ${n}`).join(", ");
    root.dataset.ranks = String(ranks.length);
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

  function drawLogs() {
    const ranks = [...store.logs.keys()].sort((a, b) => a - b);
    if (logSelect.options.length !== ranks.length) {
      logSelect.textContent = "";
      for (const r of ranks) {
        const o = el("option", "", `rank ${r}`);
        o.value = String(r);
        logSelect.append(o);
      }
    }
    if (logRank === null && ranks.length) logRank = ranks[0];
    if (logRank !== null) logSelect.value = String(logRank);
    const lines = store.logs.get(logRank) || [];
    logText.textContent = lines.length ? lines.join("\n") : "(no output yet)";
  }

  function draw(changed) {
    if (changed.all || changed.head) drawHead();
    if (changed.all || changed.loss) drawLoss();
    if (changed.all || changed.rate) drawRate();
    if (changed.all || changed.rows) drawRows();
    if (changed.all || changed.events) drawEvents();
    if (changed.all || changed.logs) drawLogs();
    root.dataset.points = String(store.points);
  }

  slider.addEventListener("input", () => {
    smoothing = Number(slider.value);
    sliderValue.textContent = slider.value;
    drawLoss();
  });
  logSelect.addEventListener("change", () => {
    logRank = Number(logSelect.value);
    drawLogs();
  });
  // JupyterLab's theme switch changes the page's colours: the canvases are redrawn in the new ones
  const redraw = () => {
    drawLoss();
    drawRate();
  };
  return follow(root, charts, store, draw, redraw, true);
}

export { Series }; // for tests/unit/test_dashboard_js.py

export default {
  initialize({ model }) {
    storeOf(model, Store);
  },
  render,
};
