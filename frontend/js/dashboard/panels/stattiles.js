// @ts-check
// The stat tiles over the map and the colour legend beside it: the live
// pool's figures, or every one at a recorded moment (time travel) with the
// reason a figure is missing then.

import { $, h, setText } from "../../common/dom.js";
import { int, pct, rate } from "../../common/format.js";
import { COLORS, rgbCss } from "../../common/palette.js";
import { explain } from "../../common/terms.js";
import { OPERATOR_TILES, operatorValues, sinceLabel, usageText } from "../state/operatortiles.js";
import { MIRROR_WHY, onMirror, unknownText } from "./unknown.js";

/** @typedef {"alloc_per_s" | "evict_per_s"} RateKey */

/**
 * The sum of a rate over points (a missing value counts 0).
 * @param {import("../wire/protocol.js").SeriesPoint[]} points
 * @param {RateKey} k
 */
function rateSum(points, k) {
  return points.reduce((a, p) => {
    const v = p[k];
    return a + (v !== null && Number.isFinite(v) ? v : 0);
  }, 0);
}

export function legend() {
  /** @type {(color: import("../../common/palette.js").RGB, label: string, term?: string) => HTMLElement} */
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

/**
 * @param {string} key
 * @param {string} label
 * @param {string} [cls]
 * @param {string} [title] its meaning (default: the glossary's for the label)
 */
function stat(key, label, cls, title) {
  const help = title || explain(label);
  return h(
    "div",
    { class: `stat ${cls || ""}`, title: help, dataset: { stat: key, help } },
    h("span", { class: "label" }, label),
    h("span", { class: "value", id: `stat-${key}` }, "—"),
  );
}

export function buildStats() {
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

/**
 * A tile's value: the figure, and beside it (smaller) its share; data-value for the tests.
 * @param {string} key
 * @param {string} text
 * @param {unknown} value
 * @param {string} [share]
 */
function setStat(key, text, value, share) {
  const el = $(`stat-${key}`); // built by buildStats()
  const want = share === undefined ? text : text + share;
  if (el.textContent !== want) {
    if (share === undefined) el.textContent = text;
    else el.replaceChildren(text, h("small", null, share));
  }
  el.dataset.value = String(value);
}

/**
 * A tile with no figure: "—" at the moment shown, or "not known" (on a
 * mirror) -- and why on hover (data-reason; `lead` before it).
 * @param {string} key
 * @param {string | undefined} reason
 * @param {string} [lead]
 */
function setReason(key, reason, lead = "at this moment") {
  const el = $(`stat-${key}`);
  const tile = /** @type {HTMLElement} */ (el.closest(".stat")); // stat() puts the value in its tile
  if (reason) {
    tile.dataset.reason = reason;
    tile.title = `${tile.dataset.help}\n\n${lead}: ${reason}`;
  } else if (tile.dataset.reason !== undefined) {
    delete tile.dataset.reason;
    tile.title = tile.dataset.help ?? "";
  }
  tile.classList.toggle("unknown", Boolean(reason) && lead !== "at this moment" && lead !== "no figure");
}

/**
 * "since start", or "since reset" once the prefix cache was reset (the REST label too).
 * @param {string | null | undefined} label (none: left as it is)
 */
function setSinceLabel(label) {
  const el = document.querySelector('.stat[data-stat="hit"] .label');
  if (el && label && el.textContent !== label) el.textContent = label;
}

/**
 * The tiles at a recorded moment (time travel): every one at that moment, or "—" with the reason.
 * @param {import("../state/history.js").HistoryState} st
 * @param {import("../state/model.js").PoolModel} model
 */
export function momentStats(st, model) {
  const sm = st.summary;
  const b = sm.blocks;
  const total = Math.max(1, sm.num_blocks - 1);
  setStat("in_use", int(b.in_use), b.in_use, pct(b.in_use / total, 0));
  setStat("cached", int(b.cached), b.cached, pct(b.cached / total, 0));
  setStat("empty", int(b.empty), b.empty, pct(b.empty / total, 0));
  setStat("usage", pct(sm.usage), sm.usage);
  setStat("usage01", usageText(sm.usage), sm.usage);
  setStat("keys", int(sm.hash_map_keys), sm.hash_map_keys);
  const running = sm.running_requests ?? null; // null on a mirror that does not know it (the reason said)
  setStat("requests", running === null ? "—" : int(running), running);
  setReason("requests", running === null ? sm.requests_reason || (onMirror() ? MIRROR_WHY.requests : "not recorded then") : "");
  // the windows, since-start and waiting as the server computed them then
  // (its series point at the moment), or none with the reason
  /** @type {import("../state/history.js").MomentTiles} */
  const t = st.tiles || { reason: "this server does not report the tiles at a moment" };
  const noPoint = t.point_ts === null || t.point_ts === undefined;
  /** @type {(key: string, v: number | null | undefined, text: (v: number) => string) => void} */
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
  const avg = (/** @type {RateKey} */ k) => (near.length ? rateSum(near, k) / near.length : null);
  const why = near.length ? "" : "the page holds no series point near the moment (its charts' window)";
  setStat("alloc", near.length ? rate(avg("alloc_per_s")) : "—", avg("alloc_per_s"));
  setStat("evict", near.length ? rate(avg("evict_per_s")) : "—", avg("evict_per_s"));
  setReason("alloc", why);
  setReason("evict", why);
}

/**
 * The tiles now: the live pool's, or the recorded moment's while time travel shows one.
 * @param {import("../state/model.js").PoolModel} model
 * @param {import("./analysis/timetravel.js").TimeTravel | null} history
 * @param {import("../render/blockmap.js").BlockMap} map
 */
export function updateStats(model, history, map) {
  const hd = model.header;
  if (!hd.blocks) return;
  if (history && history.active && history.state) {
    momentStats(history.state, model);
    return;
  }
  const c = hd.blocks;
  const total = Math.max(1, model.n - 1);
  for (const key of ["hit1m", "hit5m", "hit", "waiting", "alloc", "evict", "requests"]) setReason(key, "");
  setStat("in_use", int(c.in_use), c.in_use, pct(c.in_use / total, 0));
  setStat("cached", int(c.cached), c.cached, pct(c.cached / total, 0));
  setStat("empty", int(c.empty), c.empty, pct(c.empty / total, 0));
  setStat("usage", pct(hd.usage), hd.usage);
  setStat("usage01", usageText(hd.usage), hd.usage);
  const pts = model.points;
  const last = pts[pts.length - 1];
  const values = operatorValues(last, hd, pct, int, onMirror() ? MIRROR_WHY.requests : null);
  for (const [k, v] of Object.entries(values)) {
    setStat(k, v.text, v.value);
    if (v.reason !== undefined) setReason(k, v.reason, v.text === "—" ? "no figure" : unknownText());
  }
  setSinceLabel(sinceLabel(last));
  setStat("keys", int(hd.hash_map_keys), hd.hash_map_keys);
  const recent = pts.slice(-20);
  const avg = (/** @type {RateKey} */ k) => rateSum(recent, k) / Math.max(1, recent.length);
  setStat("alloc", rate(avg("alloc_per_s")), avg("alloc_per_s"));
  setStat("evict", rate(avg("evict_per_s")), avg("evict_per_s"));
  setText($("map-zoom"), map && map.zoom > 1 ? `zoom ×${map.zoom.toFixed(1)}` : "");
  const px = map.k * map.effScale;
  setText($("map-info"), px >= 1 ? `${px.toFixed(px < 3 ? 1 : 0)} px / block` : `${(1 / (px * px)).toFixed(1)} blocks / px`);
}
