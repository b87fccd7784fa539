// @ts-check
// The moment time travel shows, as a vertical line on a time chart (uPlot):
// the live charts keep running while the map shows a recorded moment, and
// this marks where that moment falls on them (or says it is off the chart).

/**
 * A chart with its moment mark: the line, the "before this window" tag, the time marked.
 * @typedef {import("../../../vendor/uplot/uPlot") & {_moment?: {line: HTMLDivElement, tag: HTMLSpanElement, ts: number | null}}} MarkedPlot
 */

/**
 * Mark unix time `ts` on uPlot `u` (null: no mark).
 * @param {MarkedPlot} u
 * @param {number | null} ts
 */
export function markMoment(u, ts) {
  if (!u._moment) {
    const line = document.createElement("div");
    line.className = "moment-line";
    const tag = document.createElement("span");
    tag.className = "moment-off";
    u.over.append(line, tag);
    u._moment = { line, tag, ts: null };
    const place = () => placeMoment(u);
    for (const ev of /** @type {const} */ (["setScale", "setSize"])) (u.hooks[ev] ||= []).push(place);
  }
  u._moment.ts = ts;
  placeMoment(u);
}

/** @param {MarkedPlot} u */
function placeMoment(u) {
  if (!u._moment) return;
  const { line, tag, ts } = u._moment;
  const { min = NaN, max = NaN } = u.scales.x; // NaN: not laid out yet
  const on = ts !== null && Number.isFinite(min) && Number.isFinite(max) && ts >= min && ts <= max;
  line.hidden = !on;
  if (on) line.style.left = `${u.valToPos(ts, "x")}px`;
  // a moment before the chart's window: say so at its left edge
  const before = ts !== null && Number.isFinite(min) && ts < min;
  tag.hidden = !before;
  if (before) tag.textContent = "◂ moment before this window";
  line.dataset.ts = ts === null ? "" : String(ts);
}
