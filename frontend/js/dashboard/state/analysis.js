// @ts-check
// The analysis, client side, without DOM (node tests import it): rates from
// the stream's cumulative `analysis` sections, the token-usage series from
// every frame's `tokens`, and the analysis health line (worker lag, restarts,
// errors, a section that stopped moving).  The reasons' names and colours:
// missreasons.js; the miss-ratio curve and the what-if sentences: whatif.js.

import { REASONS } from "./missreasons.js";

/**
 * A stream `analysis` section (docs/protocol.md): the fields the page reads.
 * Counters are cumulative.
 * @typedef {object} AnalysisSection
 * @property {number} ts
 * @property {Record<string, number>} misses blocks missed, by reason
 * @property {Record<string, number>} [miss_tokens] their tokens, by reason
 * @property {number} [hit_blocks]
 * @property {number} regrets
 * @property {number} evictions
 * @property {number} [regrets_per_s]
 * @property {number} [evictions_per_s]
 * @property {number | null} [regret_gap_p50]
 * @property {number | null} [regret_gap_p90]
 * @property {{lag_ops: number, resyncs: number, error: string | null} | null} [worker] the analysis worker (null: inline)
 * @property {string | null} [shadow_error]
 * @property {number | null} [shadow_lag]
 */

/**
 * One point of the analysis series: rates per second between two sections
 * (all null on a gap: the analysis restarted).
 * @typedef {object} AnalysisPoint
 * @property {number} ts
 * @property {boolean} gap
 * @property {Record<string, number | null>} misses
 * @property {Record<string, number | null>} missTokens
 * @property {number | null} hits
 * @property {number | null} regrets
 * @property {number | null} evictions
 * @property {number | null} missShare
 */

/**
 * A frame's `tokens` (docs/protocol.md: token-level usage).
 * @typedef {object} TokenUsage
 * @property {number | null} held null: not known (`reason` says why)
 * @property {number} slots_reserved
 * @property {number | null} tail_waste
 * @property {number} capacity
 * @property {number | null} usage_ratio
 * @property {number | null} fill_ratio
 * @property {string | null} [reason] why the null figures are not known
 */

/** @typedef {{ts: number, held: number | null, reserved: number, waste: number | null, capacity: number}} TokenPoint */

const sumOf = (/** @type {Record<string, number> | null | undefined} */ o) => REASONS.reduce((a, r) => a + (Number(o && o[r]) || 0), 0);

/**
 * Rates from consecutive `analysis` sections (cumulative counters).
 *
 * A section that repeats the previous one (same `ts`: the worker has not
 * reported since) is ignored; one whose counters went down (the analysis
 * restarted: a new server, or the worker's replica restarted) starts over
 * with a gap in the series (a point with null rates) and counts a reset.
 */
export class AnalysisSeries {
  // Set by clear(), which the constructor calls.
  /** @type {AnalysisPoint[]} */ points;
  /** @type {AnalysisSection | null} */ last;
  /** @type {number} */ sections;
  /** @type {number} */ resets;
  /** @type {number} */ version;

  constructor({ keep = 3600 } = {}) {
    this.keep = keep;
    this.clear();
  }

  clear() {
    this.points = []; // {ts, misses: {reason: /s}, missTokens: {reason: /s}, hits, regrets, evictions, missShare}
    this.last = null; // the latest section taken
    this.sections = 0; // sections taken (repeats not counted)
    this.resets = 0;
    this.version = 0; // bumps on every change (panels redraw on a new version)
  }

  /**
   * Take one section; returns the new point, or null (first, repeat, reset).
   * @param {AnalysisSection | null | undefined} section
   */
  ingest(section) {
    if (!section || !Number.isFinite(section.ts)) return null;
    const prev = this.last;
    if (prev && section.ts === prev.ts) return null;
    this.last = section;
    this.sections++;
    this.version++;
    if (!prev) return null;
    const dt = section.ts - prev.ts;
    if (!(dt > 0) || restarted(prev, section)) {
      this.resets++;
      this._push({ ts: section.ts, gap: true, misses: nullRates(), missTokens: nullRates(), hits: null, regrets: null, evictions: null, missShare: null });
      return null;
    }
    /** @type {Record<string, number>} */
    const misses = {};
    /** @type {Record<string, number>} */
    const missTokens = {};
    for (const r of REASONS) {
      misses[r] = ((section.misses[r] || 0) - (prev.misses[r] || 0)) / dt;
      missTokens[r] = (((section.miss_tokens || {})[r] || 0) - ((prev.miss_tokens || {})[r] || 0)) / dt;
    }
    const dMiss = sumOf(section.misses) - sumOf(prev.misses);
    const dHit = (section.hit_blocks || 0) - (prev.hit_blocks || 0);
    const pt = {
      ts: section.ts,
      gap: false,
      misses,
      missTokens,
      hits: dHit / dt,
      regrets: ((section.regrets || 0) - (prev.regrets || 0)) / dt,
      evictions: ((section.evictions || 0) - (prev.evictions || 0)) / dt,
      missShare: dMiss + dHit > 0 ? dMiss / (dMiss + dHit) : null,
    };
    this._push(pt);
    return pt;
  }

  /** @param {AnalysisPoint} pt */
  _push(pt) {
    this.points.push(pt);
    if (this.points.length > this.keep * 1.25) this.points.splice(0, this.points.length - this.keep);
  }

  /**
   * Points within `span` seconds of the newest.
   * @param {number} span
   */
  window(span) {
    return lastSpan(this.points, span);
  }

  /** Cumulative totals of the latest section: {reason: {blocks, tokens, share}}, missed, hit. */
  totals() {
    const s = this.last;
    if (!s) return null;
    const missed = sumOf(s.misses);
    /** @type {{reasons: Record<string, {blocks: number, tokens: number, share: number}>, missed: number, missedTokens: number, hit: number}} */
    const out = { reasons: {}, missed, missedTokens: sumOf(s.miss_tokens), hit: s.hit_blocks || 0 };
    for (const r of REASONS) {
      const b = s.misses[r] || 0;
      out.reasons[r] = { blocks: b, tokens: (s.miss_tokens || {})[r] || 0, share: missed ? b / missed : 0 };
    }
    return out;
  }
}

/**
 * The points (oldest first, each with its `ts`) within `span` seconds of the newest.
 * @template {{ts: number}} T
 * @param {T[]} points
 * @param {number} span
 * @returns {T[]}
 */
function lastSpan(points, span) {
  if (!points.length) return [];
  const last = points[points.length - 1].ts;
  let i = points.length - 1;
  while (i > 0 && last - points[i - 1].ts <= span) i--;
  return points.slice(i);
}

function nullRates() {
  /** @type {Record<string, null>} */
  const o = {};
  for (const r of REASONS) o[r] = null;
  return o;
}

/**
 * @param {AnalysisSection} prev
 * @param {AnalysisSection} cur
 */
function restarted(prev, cur) {
  if ((cur.hit_blocks || 0) < (prev.hit_blocks || 0)) return true;
  if ((cur.regrets || 0) < (prev.regrets || 0) || (cur.evictions || 0) < (prev.evictions || 0)) return true;
  for (const r of REASONS) if ((cur.misses[r] || 0) < (prev.misses[r] || 0)) return true;
  return false;
}

/**
 * The chart's columns from points: x, then one array per reason (stacked by the chart).
 * @param {AnalysisPoint[]} points
 * @param {{tokens?: boolean}} [opts] tokens: the missed tokens, not blocks
 */
export function missColumns(points, { tokens = false } = {}) {
  const x = points.map((p) => p.ts);
  const key = tokens ? "missTokens" : "misses";
  const ys = REASONS.map((r) => points.map((p) => p[key][r]));
  return { x, ys };
}

/** Token usage from every frame's `tokens` (beside `counts`). */
export class TokenSeries {
  // Set by clear(), which the constructor calls.
  /** @type {TokenPoint[]} */ points;
  /** @type {TokenUsage | null} */ latest;
  /** @type {number} */ version;

  constructor({ keep = 7200 } = {}) {
    this.keep = keep;
    this.clear();
  }

  clear() {
    this.points = []; // {ts, held, reserved, waste, capacity}
    this.latest = null;
    this.version = 0;
  }

  /**
   * @param {number} ts the frame's time
   * @param {TokenUsage | null | undefined} tokens its `tokens`
   */
  ingest(ts, tokens) {
    if (!tokens || !Number.isFinite(ts)) return;
    this.latest = tokens;
    const pts = this.points;
    const pt = { ts, held: tokens.held, reserved: tokens.slots_reserved, waste: tokens.tail_waste, capacity: tokens.capacity };
    if (pts.length && pts[pts.length - 1].ts >= ts) pts[pts.length - 1] = pt;
    else pts.push(pt);
    if (pts.length > this.keep * 1.25) pts.splice(0, pts.length - this.keep);
    this.version++;
  }

  /** @param {number} span seconds */
  window(span) {
    return lastSpan(this.points, span);
  }
}

/**
 * The analysis health line.  `section` is the latest stream section (or
 * null), `ctx` {sinceMoveS: seconds its report has not moved while the pool
 * kept changing (undefined: not stale), resyncs0: the worker's resyncs when
 * this page first saw it, lagWarn}.
 * -> {level: "off" | "ok" | "warn" | "err", text, title}
 */
/**
 * @param {AnalysisSection | null | undefined} section
 * @param {{enabled?: boolean, sinceMoveS?: number, resyncs0?: number, lagWarn?: number}} [ctx]
 */
export function analysisHealth(section, ctx = {}) {
  if (!section && ctx.enabled) return { level: "ok", text: "on, waiting for operations", title: "the analysis runs on this server; it reports once the pool has had operations" };
  if (!section) return { level: "off", text: "off", title: "no analysis section on the stream: the analysis is off on this server" };
  const lagWarn = ctx.lagWarn || 5000;
  const w = section.worker;
  const parts = [];
  const notes = [];
  let level = "ok";
  const worse = (/** @type {string} */ l) => {
    if (l === "err" || (l === "warn" && level === "ok")) level = l;
  };
  if (w) {
    parts.push(`lag ${w.lag_ops} ops`);
    notes.push(`the worker has ${w.lag_ops} recorded operations still to apply`);
    if (w.lag_ops >= lagWarn) worse("warn");
    if (w.resyncs) {
      parts.push(`${w.resyncs} restart${w.resyncs > 1 ? "s" : ""}`);
      notes.push(`it restarted ${w.resyncs} time(s) after falling behind (counters start over)`);
      if (ctx.resyncs0 !== undefined && w.resyncs > ctx.resyncs0) worse("warn");
    }
    if (w.error) {
      parts.push("error");
      notes.push(`worker error: ${w.error}`);
      worse("err");
    }
  } else {
    parts.push("inline");
    notes.push("the analysis runs on the engine (exact, synchronous)");
  }
  if (section.shadow_error) {
    parts.push("shadows failed");
    notes.push(`shadow pools: ${section.shadow_error}`);
    worse("err");
  } else if (section.shadow_lag && section.shadow_lag >= lagWarn * 10) {
    parts.push(`shadows lag ${section.shadow_lag}`);
    worse("warn");
  }
  if (section.shadow_lag !== null && section.shadow_lag !== undefined) notes.push(`shadow pools: ${section.shadow_lag} accesses not applied yet`);
  if (ctx.sinceMoveS !== undefined && ctx.sinceMoveS > 5) {
    parts.push(`stale ${Math.round(ctx.sinceMoveS)}s`);
    notes.push(`its report has not moved for ${Math.round(ctx.sinceMoveS)} s`);
    worse("warn");
  }
  return { level, text: parts.join(" · "), title: notes.join("\n") };
}

/**
 * A histogram's non-empty middle: {labels (upper bounds), counts} (keeps one empty bucket of context).
 * @param {{buckets: number[], counts: number[]} | null | undefined} hg
 */
export function trimHistogram(hg) {
  if (!hg || !hg.counts || !hg.counts.length) return { bounds: [], counts: [], first: 0 };
  let a = 0;
  let b = hg.counts.length - 1;
  while (a < b && hg.counts[a] === 0) a++;
  while (b > a && hg.counts[b] === 0) b--;
  a = Math.max(0, a - 1);
  b = Math.min(hg.counts.length - 1, b + 1);
  return { bounds: hg.buckets.slice(a, b + 1), counts: hg.counts.slice(a, b + 1), first: a };
}
