// @ts-check
// The cadences of the one requestAnimationFrame loop (each part on its own),
// which analysis panels are on screen, and the slower REST views polled
// only for those.

import { $, Every } from "../common/dom.js";

export const cadence = {
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
export const onScreen = new Set();
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
/** @type {Set<string>} */
const pending = new Set();
/**
 * fn() unless the last call for `key` is still on its way.
 * @param {string} key
 * @param {() => unknown} fn
 */
function once(key, fn) {
  if (pending.has(key)) return;
  pending.add(key);
  Promise.resolve(fn()).finally(() => pending.delete(key));
}
/**
 * @param {number} now the frame's performance.now()
 * @param {{analysis: import("./state/analysishub.js").AnalysisHub, conn: import("./wire/stream.js").StreamConnection, misses: {poll(): unknown}, regret: {poll(): unknown}, whatif: {poll(): unknown}, history: {poll(): unknown, pollEvery: number}}} parts
 */
export function pollAnalysis(now, { analysis, conn, misses, regret, whatif, history }) {
  if (!analysis.section || conn.health.state !== "open") return;
  if (performance.now() - analysis.firstAt < 2500) return;
  if (onScreen.has("miss-panel")) cadence.misses.run(now, () => once("misses", () => misses.poll()));
  if (onScreen.has("regret-panel")) cadence.regret.run(now, () => once("regret", () => regret.poll()));
  if (onScreen.has("whatif-panel")) cadence.shadows.run(now, () => once("shadows", () => whatif.poll()));
  cadence.history.ms = history.pollEvery;
  cadence.history.run(now, () => once("history", () => history.poll()));
}
