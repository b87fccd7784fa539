// The dashboard: wires the model, the stream, the map and the panels, and
// runs one requestAnimationFrame loop (one map draw per frame; panels on
// their own slower cadences).  It exports its parts (`parts`) and sets no
// globals: testhooks.js, loaded only by the tests and the benchmark, puts
// them on window.__bp.

import { ApiError, api, get, getToken, onApiError } from "../common/api.js";
import { $, Every, h, setText } from "../common/dom.js";
import { int, pct, rate } from "../common/format.js";
import { observeHint } from "../common/observe.js";
import { COLORS, rgbCss } from "../common/palette.js";
import { explain, explainAll } from "../common/terms.js";
import { STATE_NAMES } from "./wire/protocol.js";
import { StreamConnection } from "./wire/stream.js";
import { AnalysisHub } from "./state/analysishub.js";
import { OPERATOR_TILES, operatorValues, sinceLabel, usageText } from "./state/operatortiles.js";
import { PoolModel } from "./state/model.js";
import { PrefixTree } from "./state/prefixtree.js";
import { BlockMap } from "./render/blockmap.js";
import { Charts } from "./render/charts.js";
import { AnalysisHealthItem } from "./panels/analysis/analysishealth.js";
import { AnalysisLoader } from "./panels/analysis/analysisload.js";
import { MissPanel } from "./panels/analysis/misspanel.js";
import { RegretPanel } from "./panels/analysis/regretpanel.js";
import { TimeTravel } from "./panels/analysis/timetravel.js";
import { TokenPanel } from "./panels/analysis/tokenpanel.js";
import { WhatIfPanel } from "./panels/analysis/whatifpanel.js";
import { Controls } from "./panels/controls.js";
import { DetailPanel } from "./panels/detail.js";
import { EventLog } from "./panels/events.js";
import { HashMapPanel } from "./panels/hashmap.js";
import { HealthBar } from "./panels/health.js";
import { LruPanel } from "./panels/lru.js";
import { MirrorItem } from "./panels/mirroritem.js";
import { RequestView } from "./panels/requestview.js";
import { TraceItem } from "./panels/traceitem.js";
import { TreePanel } from "./panels/treeview.js";

const model = new PoolModel();
const tree = new PrefixTree();
const perf = { raf: 0, frameMs: 0, maxFrameMs: 0, longFrames: 0, map: null, started: performance.now() };
const errors = [];

function showError(msg) {
  errors.push(msg);
  const el = $("errline");
  el.textContent = msg;
  el.classList.add("on");
  clearTimeout(showError.timer);
  showError.timer = setTimeout(() => el.classList.remove("on"), 8000);
}

function legend() {
  const item = (color, label, term = label) =>
    h("span", { class: "lg", title: explain(term) }, h("i", { style: `background:${rgbCss(color)}` }), label);
  $("legend").replaceChildren(
    item(COLORS.in_use[0], "in use ×1"),
    item(COLORS.in_use[1], "×2", "in use ×1"),
    item(COLORS.in_use[2], "×3", "in use ×1"),
    item(COLORS.in_use[3], "×4+", "in use ×1"),
    item(COLORS.cached, "cached"),
    item(COLORS.risk, "evicted soon"),
    item(COLORS.empty, "empty"),
    item(COLORS.null, "null"),
  );
}

function stat(key, label, cls, title) {
  const help = title || explain(label);
  return h(
    "div",
    { class: `stat ${cls || ""}`, title: help, dataset: { stat: key, help } },
    h("span", { class: "label" }, label),
    h("span", { class: "value", id: `stat-${key}` }, "—"),
  );
}

function buildStats() {
  $("stats").replaceChildren(
    stat("in_use", "in use", "st-in_use"),
    stat("cached", "cached", "st-cached"),
    stat("empty", "empty", "st-empty"),
    stat("usage", "usage", "", "blocks in use / usable blocks"),
    ...OPERATOR_TILES.slice(0, 4).map(([k, label, title]) => stat(k, label, "", title)),
    stat("keys", "hash keys"),
    ...OPERATOR_TILES.slice(4).map(([k, label, title]) => stat(k, label, "", title)),
    stat("alloc", "alloc/s"),
    stat("evict", "evict/s"),
  );
}

/** A tile's value: the figure, and beside it (smaller) its share; data-value for the tests. */
function setStat(key, text, value, share) {
  const el = document.getElementById(`stat-${key}`);
  const want = share === undefined ? text : text + share;
  if (el.textContent !== want) {
    if (share === undefined) el.textContent = text;
    else el.replaceChildren(text, h("small", null, share));
  }
  el.dataset.value = String(value);
}

/** A tile with no figure at the moment shown: "—", and why on hover (data-reason). */
function setReason(key, reason) {
  const el = document.getElementById(`stat-${key}`);
  const tile = el.closest(".stat");
  if (reason) {
    tile.dataset.reason = reason;
    tile.title = `${tile.dataset.help}\n\nat this moment: ${reason}`;
  } else if (tile.dataset.reason !== undefined) {
    delete tile.dataset.reason;
    tile.title = tile.dataset.help;
  }
}

/** "since start", or "since reset" once the prefix cache was reset (the REST label too). */
function setSinceLabel(label) {
  const el = document.querySelector('.stat[data-stat="hit"] .label');
  if (el && label && el.textContent !== label) el.textContent = label;
}

/** The tiles at a recorded moment (time travel): every one at that moment, or "—" with the reason. */
function momentStats(st) {
  const sm = st.summary;
  const b = sm.blocks;
  const total = Math.max(1, sm.num_blocks - 1);
  setStat("in_use", int(b.in_use), b.in_use, pct(b.in_use / total, 0));
  setStat("cached", int(b.cached), b.cached, pct(b.cached / total, 0));
  setStat("empty", int(b.empty), b.empty, pct(b.empty / total, 0));
  setStat("usage", pct(sm.usage), sm.usage);
  setStat("usage01", usageText(sm.usage), sm.usage);
  setStat("keys", int(sm.hash_map_keys), sm.hash_map_keys);
  setStat("requests", int(sm.running_requests), sm.running_requests);
  // the windows, since-start and waiting as the server computed them then
  // (its series point at the moment), or none with the reason
  const t = st.tiles || { reason: "this server does not report the tiles at a moment" };
  const noPoint = t.point_ts === null || t.point_ts === undefined;
  const fig = (key, v, text) => {
    setStat(key, v === null || v === undefined ? "—" : text(v), v ?? null);
    setReason(key, v === null || v === undefined ? (noPoint ? t.reason : "no value then (under two samples, or no query)") : "");
  };
  fig("hit1m", t.hit_rate_1m, (v) => pct(v));
  fig("hit5m", t.hit_rate_5m, (v) => pct(v));
  fig("hit", t.hit_rate_since, (v) => pct(v));
  fig("waiting", t.waiting, (v) => int(v));
  if (t.since_label) setSinceLabel(t.since_label);
  // the rates around that moment, when the page still holds its points
  const near = model.points.filter((p) => Math.abs(p.ts - st.at.ts) <= 1);
  const avg = (k) => (near.length ? near.reduce((a, p) => a + (Number.isFinite(p[k]) ? p[k] : 0), 0) / near.length : null);
  const why = near.length ? "" : "the page holds no series point near the moment (its charts' window)";
  setStat("alloc", near.length ? rate(avg("alloc_per_s")) : "—", avg("alloc_per_s"));
  setStat("evict", near.length ? rate(avg("evict_per_s")) : "—", avg("evict_per_s"));
  setReason("alloc", why);
  setReason("evict", why);
}

function updateStats() {
  const hd = model.header;
  if (!hd.blocks) return;
  if (history && history.active && history.state) {
    momentStats(history.state);
    return;
  }
  const c = hd.blocks;
  const total = Math.max(1, model.n - 1);
  for (const key of ["hit1m", "hit5m", "hit", "waiting", "alloc", "evict"]) setReason(key, "");
  setStat("in_use", int(c.in_use), c.in_use, pct(c.in_use / total, 0));
  setStat("cached", int(c.cached), c.cached, pct(c.cached / total, 0));
  setStat("empty", int(c.empty), c.empty, pct(c.empty / total, 0));
  setStat("usage", pct(hd.usage), hd.usage);
  setStat("usage01", usageText(hd.usage), hd.usage);
  const pts = model.points;
  const last = pts[pts.length - 1];
  for (const [k, v] of Object.entries(operatorValues(last, hd, pct, int))) setStat(k, v.text, v.value);
  setSinceLabel(sinceLabel(last));
  setStat("keys", int(hd.hash_map_keys), hd.hash_map_keys);
  const recent = pts.slice(-20);
  const avg = (k) => recent.reduce((a, p) => a + (Number.isFinite(p[k]) ? p[k] : 0), 0) / Math.max(1, recent.length);
  setStat("alloc", rate(avg("alloc_per_s")), avg("alloc_per_s"));
  setStat("evict", rate(avg("evict_per_s")), avg("evict_per_s"));
  setText($("map-zoom"), map && map.zoom > 1 ? `zoom ×${map.zoom.toFixed(1)}` : "");
  const px = map.k * map.effScale;
  setText($("map-info"), px >= 1 ? `${px.toFixed(px < 3 ? 1 : 0)} px / block` : `${(1 / (px * px)).toFixed(1)} blocks / px`);
}

function showFacts(cfg) {
  if (!cfg) return;
  setText(
    $("facts"),
    `${int(cfg.num_blocks)} blocks × ${cfg.block_size} tok · ${cfg.hash_fn} · ${cfg.num_groups} group${cfg.num_groups > 1 ? "s" : ""} · caching ${cfg.enable_caching ? "on" : "off"} · ${cfg.tick_hz} Hz`,
  );
  controls.setAuth(Boolean(cfg.auth_required_for_writes));
}

function hoverLine(id) {
  if (id < 0 || id >= model.n) return "—";
  const st = STATE_NAMES[model.state[id]];
  return `#${id} · ${st.replace("_", " ")} · ref ${model.refCnt[id]}`;
}

legend();
buildStats();
const map = new BlockMap($("map"), $("map-overlay"), model);
perf.map = map.perf;
let lru = null;
const detail = new DetailPanel(model, map, (pos) => (lru ? lru.eta(pos) : null));
lru = new LruPanel(model, map, tree, (id) => detail.select(id));
const charts = new Charts(model);
const events = new EventLog(model);
const hashmap = new HashMapPanel(
  model,
  (ids) => detail.showHash(ids),
  (id) => detail.select(id),
);
const treePanel = new TreePanel(model, tree, (hexes) => {
  const ids = [];
  for (const hex of hexes) for (const s of model.index.searchPrefix(hex, 4)) ids.push(...model.index.idsOf(s));
  detail.showHash(ids);
});
const conn = new StreamConnection(model, { token: getToken });
const controls = new Controls(model, detail, () => {
  conn.reconnectNow();
  boot();
});
const health = new HealthBar(conn, model, perf);
const analysis = new AnalysisHub(model);
const analysisHealth = new AnalysisHealthItem(analysis);
new MirrorItem(() => controls.setReadOnly()); // the top bar item, only on `blockpool serve --mirror`
const traceItem = new TraceItem();
const windowSel = $("chart-window");
const tokensPanel = new TokenPanel(analysis, windowSel);
const showRequest = (rid) => {
  if (history && history.active) history.live();
  detail.select(-1);
  detail.showRequest(rid);
  requestView.show(rid, { scroll: false });
};
const misses = new MissPanel(analysis, windowSel, showRequest);
const regret = new RegretPanel(analysis, windowSel);
const whatif = new WhatIfPanel(analysis);
const loader = new AnalysisLoader(model, analysis, { misses, regret, whatif, tokens: tokensPanel });
// One request's story: searched, or from the block detail, the running
// list, the regret table and the event log (a hash: who holds it now).
async function holdersOf(hex) {
  const ids = [];
  for (const s of model.index.searchPrefix(hex, 4)) ids.push(...model.index.idsOf(s));
  for (const id of ids.filter((i) => model.state[i] === 1).slice(0, 4)) {
    const b = await get(`/api/blocks/${id}`);
    if (b.requests && b.requests.length) return b.requests;
  }
  return [];
}
const requestView = new RequestView({
  onBlock: (id) => detail.select(id),
  blockSize: () => model.config && model.config.block_size,
  holdersOf,
}).mount(document.querySelector(".tt-panel"));
const showStory = (rid) => requestView.show(rid);
detail.onStory = showStory;
controls.onStory = showStory;
regret.onStory = showStory;
events.onStory = (hex) => requestView.fromHash(hex);
const history = new TimeTravel(model, map, {
  onEnter: () => {
    detail.select(-1);
    detail.clearHighlights();
  },
  onLeave: () => {
    map.setHighlight("hash", []);
    follow(null);
  },
  onMoment: (st, src) => follow({ st, src }),
  showRequest,
  highlight: (ids) => map.setHighlight("hash", ids),
  visible: () => onScreen.has("tt-panel"),
});

/** The panels that follow a recorded moment (or the live pool again: null). */
function follow(m) {
  lru.setMoment(m);
  detail.setMoment(m);
  const ts = m ? m.st.at.ts : null;
  charts.setMoment(ts);
  tokensPanel.chart.setMoment(ts);
  misses.chart.setMoment(ts);
  regret.chart.setMoment(ts);
  updateStats();
}

map.onhover = (id) => {
  if (history.active) {
    setText($("map-hover"), history.hoverLine(id));
    return;
  }
  setText($("map-hover"), hoverLine(id));
  detail.hover(id);
};
map.onselect = (id) => {
  if (history.active) detail.showMoment(id);
  else detail.select(id);
};
onApiError((err) => {
  if (err.status === 404 && err.code === "not_found") return; // a request that just finished
  showError(`${err.message}${err.code ? ` (${err.code})` : ""}`);
});

model.on("config", (frame) => {
  showFacts(frame.header.config);
  if (model.seq === null) tree.clear(); // another server (or the first connect)
  if (model.seq === null && history.active) history.live(); // its recording is gone
});
model.on("snapshot", (frame) => {
  tree.applyEvents(frame.header.recent_events || []);
  treePanel.load();
  events.dirty = true;
  detail.render();
});
model.on("delta", (frame) => {
  const ev = frame.header.events;
  if (ev && ev.length) tree.applyEvents(ev);
});

const cadence = {
  stats: new Every(250),
  health: new Every(250),
  lru: new Every(500),
  charts: new Every(250),
  events: new Every(250),
  hashmap: new Every(1000),
  tree: new Every(2000),
  demo: new Every(2000),
  requests: new Every(2000),
  detail: new Every(1000),
  analysis: new Every(500),
  tokens: new Every(500),
  analysisHealth: new Every(500),
  trace: new Every(2000),
  // REST, every few seconds (quiet: failures show in their panels)
  misses: new Every(4000),
  regret: new Every(4000),
  shadows: new Every(5000),
  history: new Every(3000),
};
// The analysis row's REST views are asked for only while their panel is on
// screen (each is a query to the analysis worker); a panel scrolled into
// view is refreshed at once.
const onScreen = new Set();
const observer = new IntersectionObserver(
  (entries) => {
    for (const e of entries) {
      if (e.isIntersecting) onScreen.add(e.target.id);
      else onScreen.delete(e.target.id);
    }
  },
  { threshold: 0 },
);
for (const id of ["miss-panel", "regret-panel", "whatif-panel", "tt-panel"]) observer.observe($(id));

/**
 * The slower REST views: only while the stream is live and has brought
 * this server's analysis reports for a couple of seconds (its worker runs
 * and reports: a restarted server answers HTTP before its worker is up, a
 * worker's answer waits until it has caught up, and the page's first
 * frames come first), one request per view at a time, and only for panels
 * on screen.
 */
const pending = new Set();
function once(key, fn) {
  if (pending.has(key)) return;
  pending.add(key);
  Promise.resolve(fn()).finally(() => pending.delete(key));
}
function pollAnalysis(now) {
  if (!analysis.section || conn.health.state !== "open") return;
  if (performance.now() - analysis.firstAt < 2500) return;
  if (onScreen.has("miss-panel")) cadence.misses.run(now, () => once("misses", () => misses.poll()));
  if (onScreen.has("regret-panel")) cadence.regret.run(now, () => once("regret", () => regret.poll()));
  if (onScreen.has("whatif-panel")) cadence.shadows.run(now, () => once("shadows", () => whatif.poll()));
  cadence.history.ms = history.pollEvery;
  cadence.history.run(now, () => once("history", () => history.poll()));
}

function frame(now) {
  perf.raf++;
  const t0 = performance.now();
  try {
    map.render();
    cadence.stats.run(now, updateStats);
    cadence.health.run(now, () => health.update(now));
    if (model.seq !== null) {
      cadence.lru.run(now, () => lru.update(now));
      cadence.charts.run(now, () => charts.update());
      cadence.events.run(now, () => events.update());
      cadence.hashmap.run(now, () => hashmap.update());
      cadence.tree.run(now, () => treePanel.update());
      cadence.demo.run(now, () => controls.refreshDemo());
      cadence.requests.run(now, () => controls.refreshRequests());
      if (detail.pinned >= 0) cadence.detail.run(now, () => detail.fetch(detail.pinned));
      else if (detail.shown < 0) cadence.detail.run(now, () => (detail.refreshRequest(), detail.render()));
      cadence.tokens.run(now, () => tokensPanel.update());
      cadence.analysis.run(now, () => {
        misses.update();
        regret.update();
      });
      pollAnalysis(now);
    }
    cadence.analysisHealth.run(now, () => analysisHealth.update(now));
    cadence.trace.run(now, () => traceItem.refresh().then(() => controls.renderTrace(traceItem.status)));
  } catch (err) {
    showError(`render: ${err.message}`);
    console.error(err); // eslint-disable-line no-console
  }
  const ms = performance.now() - t0;
  perf.frameMs += ms;
  perf.maxFrameMs = Math.max(perf.maxFrameMs, ms);
  if (ms > 50) perf.longFrames++;
  requestAnimationFrame(frame);
}

/** The "fleet" link: only to an observer that answers (--fleet-url), never a dead end. */
async function fleetLink() {
  const link = $("fleet-link");
  link.hidden = true;
  try {
    const kv = await api("GET", "/api/kv-events", undefined, { quiet: true });
    const url = kv && kv.fleet_url;
    if (!url) return;
    // another origin: an opaque answer proves it is up without reading it
    await fetch(new URL("api/health", url.endsWith("/") ? url : `${url}/`), { mode: "no-cors", cache: "no-store" });
    const hint = observeHint(kv, location.hostname);
    link.href = url;
    link.target = "_blank";
    link.rel = "noopener";
    link.title = `The fleet observer at ${url}${hint ? ` (${hint.text})` : ""}.`;
    link.hidden = false;
  } catch {
    link.hidden = true;
  } finally {
    link.dataset.checked = "1"; // for the tests: the check is over, shown or not
  }
}

async function boot() {
  try {
    const cfg = await get("/api/config");
    showFacts(cfg);
    fleetLink();
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) {
      controls.setAuth(true);
      showError("this server protects reads: enter its token at the top right");
    }
  }
}

/** The page's parts, for testhooks.js (the tests and the benchmark). */
export const parts = {
  model,
  map,
  conn,
  lru,
  detail,
  tree,
  treePanel,
  charts,
  events,
  hashmap,
  controls,
  analysis,
  loader,
  requestView,
  panels: { tokens: tokensPanel, misses, regret, whatif },
  history,
  onScreen,
  cadence,
  perf,
  errors,
};

explainAll(document); // column heads (the charts' legends too) and [data-term] words: their meaning on hover
boot();
loader.start(); // the analysis row from REST now, not after the stream's first reports
conn.start();
requestAnimationFrame(frame);
