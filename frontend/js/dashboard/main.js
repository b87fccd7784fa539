// @ts-check
// The dashboard: wires the model, the stream, the map and the panels, and
// runs one requestAnimationFrame loop (one map draw per frame; panels on
// their own slower cadences).  It exports its parts (`parts`) and sets no
// globals: testhooks.js, loaded only by the tests and the benchmark, puts
// them on window.__bp.

import { api, get, getToken, onApiError } from "../common/api.js";
import { $, setText } from "../common/dom.js";
import { explainAll } from "../common/terms.js";
import { STATE_NAMES } from "./wire/protocol.js";
import { StreamConnection } from "./wire/stream.js";
import { AnalysisHub } from "./state/analysishub.js";
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
import { errors, showError } from "./panels/errline.js";
import { EventLog } from "./panels/events.js";
import { HashMapPanel } from "./panels/hashmap.js";
import { HealthBar } from "./panels/health.js";
import { LruPanel } from "./panels/lru.js";
import { MirrorItem } from "./panels/mirroritem.js";
import { RequestView } from "./panels/requestview.js";
import { buildStats, legend, updateStats } from "./panels/stattiles.js";
import { TraceItem } from "./panels/traceitem.js";
import { TreePanel } from "./panels/treeview.js";
import { boot, showFacts } from "./boot.js";
import { cadence, onScreen, pollAnalysis } from "./cadence.js";
import { openUrlMoment } from "./urlmoment.js";

const model = new PoolModel();
const tree = new PrefixTree();
/**
 * The page's frame timing (the health bar and the tests read it); `map`: the
 * block map's draw figures, set once the map exists.
 * @type {{raf: number, frameMs: number, maxFrameMs: number, longFrames: number, map: BlockMap["perf"] | null, started: number}}
 */
const perf = { raf: 0, frameMs: 0, maxFrameMs: 0, longFrames: 0, map: null, started: performance.now() };

/**
 * Blocks holding the first keys whose hash starts with `hex` (none on a model without the hash index).
 * @param {string} hex
 */
function blocksWithPrefix(hex) {
  const index = model.index;
  /** @type {number[]} */
  const ids = [];
  if (!index) return ids;
  for (const s of index.searchPrefix(hex, 4)) ids.push(...index.idsOf(s));
  return ids;
}

/** @param {number} id */
function hoverLine(id) {
  if (id < 0 || id >= model.n) return "—";
  const st = STATE_NAMES[model.state[id]];
  return `#${id} · ${st.replace("_", " ")} · ref ${model.refCnt[id]}`;
}

legend();
buildStats();
const map = new BlockMap($("map", HTMLCanvasElement), $("map-overlay", HTMLCanvasElement), model);
perf.map = map.perf;
/** @type {LruPanel | null} */
let lru = null;
const detail = new DetailPanel(model, map, (pos) => (lru ? lru.eta(pos) : null));
const lruPanel = new LruPanel(model, map, tree, (id) => detail.select(id));
lru = lruPanel;
const charts = new Charts(model);
const events = new EventLog(model);
const hashmap = new HashMapPanel(
  model,
  (ids) => detail.showHash(ids),
  (id) => detail.select(id),
);
const treePanel = new TreePanel(model, tree, (hexes) => {
  detail.showHash(hexes.flatMap(blocksWithPrefix));
});
const conn = new StreamConnection(model, { token: getToken });
const controls = new Controls(model, detail, () => {
  conn.reconnectNow();
  boot(controls);
});
const health = new HealthBar(conn, model, perf);
const analysis = new AnalysisHub(model);
const analysisHealth = new AnalysisHealthItem(analysis);
new MirrorItem(() => controls.setReadOnly(), conn.mirrorLag); // the top bar item, only on `blockpool serve --mirror`
const traceItem = new TraceItem();
const windowSel = $("chart-window");
const tokensPanel = new TokenPanel(analysis, windowSel);
const showRequest = (/** @type {string} */ rid) => {
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
/** @param {string} hex */
async function holdersOf(hex) {
  const ids = blocksWithPrefix(hex);
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
const showStory = (/** @type {string} */ rid) => requestView.show(rid);
detail.onStory = showStory;
controls.onStory = showStory;
regret.onStory = showStory;
events.onStory = (/** @type {string} */ hex) => requestView.fromHash(hex);
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
// /?at=<time>: the page opens in time travel at that moment (Grafana's data links)
openUrlMoment(history, model, (path) => api("GET", path, undefined, { quiet: true }));

/**
 * The panels that follow a recorded moment (or the live pool again: null).
 * @param {import("./state/history.js").Moment | null} m
 */
function follow(m) {
  lruPanel.setMoment(m);
  detail.setMoment(m);
  const ts = m ? m.st.at.ts : null;
  charts.setMoment(ts);
  tokensPanel.chart.setMoment(ts);
  misses.chart.setMoment(ts);
  regret.chart.setMoment(ts);
  updateStats(model, history, map);
}

map.onhover = (/** @type {number} */ id) => {
  if (history.active) {
    setText($("map-hover"), history.hoverLine(id));
    return;
  }
  setText($("map-hover"), hoverLine(id));
  detail.hover(id);
};
map.onselect = (/** @type {number} */ id) => {
  if (history.active) detail.showMoment(id);
  else detail.select(id);
};
onApiError((err) => {
  if (err.status === 404 && err.code === "not_found") return; // a request that just finished
  showError(`${err.message}${err.code ? ` (${err.code})` : ""}`);
});

model.on("config", (frame) => {
  showFacts(frame.header.config, controls);
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

/** @param {number} now */
function frame(now) {
  perf.raf++;
  const t0 = performance.now();
  try {
    map.render();
    cadence.stats.run(now, () => updateStats(model, history, map));
    cadence.health.run(now, () => health.update(now));
    if (model.seq !== null) {
      cadence.lru.run(now, () => lruPanel.update(now));
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
      pollAnalysis(now, { analysis, conn, misses, regret, whatif, history });
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

/** The page's parts, for testhooks.js (the tests and the benchmark). */
export const parts = {
  model,
  map,
  conn,
  lru: lruPanel,
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
boot(controls);
loader.start(); // the analysis row from REST now, not after the stream's first reports
conn.start();
requestAnimationFrame(frame);
