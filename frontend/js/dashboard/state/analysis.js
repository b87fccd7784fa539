// @ts-check
// The analysis, client side, without DOM (node tests import it): rates from
// the stream's cumulative `analysis` sections, the token-usage series from
// every frame's `tokens`, the miss-ratio curve and the what-if sentences from
// GET /api/shadows (or the section's shadow rows), and the analysis health
// line (worker lag, restarts, errors, a section that stopped moving).

export const REASONS = ["last_token", "block_size_floor", "cold", "evicted", "extra_keys", "chain_broken", "reset", "skipped"];

/** @type {Record<string, string>} */
export const REASON_LABEL = {
  last_token: "last token",
  block_size_floor: "block-size floor",
  cold: "cold",
  evicted: "evicted",
  extra_keys: "extra keys",
  chain_broken: "chain broken",
  reset: "reset",
  skipped: "skipped by the engine",
};

/** @type {Record<string, string>} */
export const REASON_HELP = {
  last_token: "holds the last prompt token: always computed, even when cached",
  block_size_floor: "partial tail block, or the prompt shares only part of this block with an earlier one",
  cold: "its hash was never seen (within the bounded memory of evictions)",
  evicted: "its hash was cached before and evicted since (its block reused, or the evict operation)",
  extra_keys: "the same first-block tokens were stored under other extra keys (cache salt, LoRA)",
  chain_broken: "still cached, but an earlier block missed and the lookup stops at the first miss",
  reset: "its hash was cached before and dropped by a prefix-cache reset since: not an eviction, no regret",
  skipped: "a mirrored engine did not look the prompt up (a prompt_logprobs request skips the prefix cache)",
};

/**
 * [r, g, b] per reason (+ hit, decode, pending): the chart, the table, the request bars.
 * @type {Record<string, import("../../common/palette.js").RGB>}
 */
export const REASON_RGB = {
  hit: [46, 160, 67],
  last_token: [210, 168, 255],
  block_size_floor: [227, 179, 65],
  cold: [110, 118, 129],
  evicted: [248, 81, 73],
  extra_keys: [219, 97, 162],
  chain_broken: [240, 136, 62],
  reset: [57, 197, 187],
  skipped: [121, 192, 255],
  decode: [48, 54, 61],
  pending: [72, 79, 88],
};

/** @type {Record<string, import("../../common/palette.js").RGB>} */
export const POLICY_RGB = {
  append_all: [88, 166, 255],
  uncached_first: [63, 185, 80],
  s3fifo: [227, 179, 65],
};
const EXTRA_POLICY_RGB = [
  [210, 168, 255],
  [219, 97, 162],
  [121, 192, 255],
];

/**
 * A shadow policy's colour (one of the extra ones, by `i`, for a policy not named here).
 * @param {string} policy
 */
export function policyRgb(policy, i = 0) {
  return POLICY_RGB[policy] || EXTRA_POLICY_RGB[i % EXTRA_POLICY_RGB.length];
}

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

/** @typedef {{factor: number, capacity: number, hit_rate: number, evictions: number | null}} CurvePoint */

/**
 * The miss-ratio curve: points per policy (vLLM's own first), the factors
 * they have, and the real pool's figure (from REST; null from a section).
 * @typedef {{policies: {policy: string, points: CurvePoint[]}[], factors: number[], real: {capacity: number, hit_rate?: number} | null}} Curve
 */

/**
 * What buildCurve reads: a stream section's `shadows` rows, or GET
 * /api/shadows (`shadows` objects, `curve`, `real`).
 * @typedef {object} ShadowsSource
 * @property {unknown[]} [shadows]
 * @property {Record<string, {factor: number, capacity: number, hit_rate: number}[]>} [curve]
 * @property {{capacity: number, hit_rate?: number, span?: {hit_rate: number}}} [real]
 */

/**
 * The miss-ratio curve per policy.  `src` is GET /api/shadows (its `curve`
 * and `real`) or a stream section (its `shadows` rows:
 * [name, policy, factor, capacity, hit_rate, queried, hits, evictions]).
 * @param {ShadowsSource | null | undefined} src
 * @returns {Curve}
 */
export function buildCurve(src) {
  /** @type {Map<string, CurvePoint[]>} */
  const by = new Map();
  const add = (/** @type {string} */ policy, /** @type {CurvePoint} */ pt) => {
    const list = by.get(policy);
    if (list) list.push(pt);
    else by.set(policy, [pt]);
  };
  let real = null;
  if (src && Array.isArray(src.shadows) && src.shadows.length && Array.isArray(src.shadows[0])) {
    // the stream section's rows (docs/protocol.md)
    const rows = /** @type {[string, string, number, number, number, number, number, number][]} */ (src.shadows);
    for (const [, policy, factor, capacity, hitRate, , , evictions] of rows) {
      add(policy, { factor, capacity, hit_rate: hitRate, evictions });
    }
  } else if (src && src.curve) {
    /** @type {Map<string, number>} */
    const ev = new Map();
    // GET /api/shadows: one object per shadow pool
    const pools = /** @type {{policy: string, factor: number, evictions: number}[]} */ (src.shadows || []);
    for (const s of pools) ev.set(`${s.policy}@${s.factor}`, s.evictions);
    for (const [policy, pts] of Object.entries(src.curve)) {
      for (const p of pts) add(policy, { factor: p.factor, capacity: p.capacity, hit_rate: p.hit_rate, evictions: ev.get(`${policy}@${p.factor}`) ?? null });
    }
    if (src.real) {
      const span = src.real.span || src.real;
      real = { capacity: src.real.capacity, hit_rate: span.hit_rate };
    }
  }
  /** @type {Set<number>} */
  const factors = new Set();
  /** @type {Curve["policies"]} */
  const policies = [];
  for (const [policy, pts] of by) {
    pts.sort((a, b) => a.factor - b.factor);
    for (const p of pts) factors.add(p.factor);
    policies.push({ policy, points: pts });
  }
  // vLLM's own order first (the real pool's policy), then the others
  policies.sort((a, b) => (a.policy === "append_all" ? -1 : b.policy === "append_all" ? 1 : a.policy < b.policy ? -1 : 1));
  return { policies, factors: [...factors].sort((a, b) => a - b), real };
}

// (null: an axis tick of an empty curve -- the what-if panel asked before the shadows' first report)
export const factorLabel = (/** @type {number | null | undefined} */ f) => (f === null || f === undefined ? "" : `${Number.isInteger(f) ? f : f.toString().replace(/^0\./, ".")}×`);

const pts = (/** @type {number} */ x) => `${x >= 0 ? "+" : "−"}${Math.abs(x * 100).toFixed(1)} pt`;
const pctStr = (/** @type {number | null | undefined} */ x) => (x === null || x === undefined || !Number.isFinite(x) ? "—" : `${(x * 100).toFixed(1)}%`);

/**
 * The curve in words: "Now (1×): 88.2%", then "2× the blocks (16,382):
 * 88.4%, +0.2 pt" and "Evicting s3fifo at 1×: 88.6%, +0.4 pt".  The baseline
 * is the pool's own free order at 1× in the shadows (the same requests,
 * counted the same way): `own`, vLLM 0.16's append_all unless told (a
 * mirror's shadows run in its engine's order); the real pool when there is none.
 * @param {Curve} curve
 * @param {string} [ownPolicy]
 */
export function whatIf(curve, ownPolicy = "append_all") {
  /** @type {{kind: string, policy: string, factor: number, delta: number, text: string}[]} */
  const out = [];
  const own = curve.policies.find((p) => p.policy === ownPolicy);
  const at1 = own && own.points.find((p) => p.factor === 1);
  const base = at1 ? at1.hit_rate : curve.real ? curve.real.hit_rate : null;
  if (base === null || base === undefined) return out;
  const nf = new Intl.NumberFormat("en-US");
  out.push({
    kind: "base",
    policy: at1 ? own.policy : "real",
    factor: 1,
    delta: 0,
    text: `Now (1×${at1 ? `, ${nf.format(at1.capacity)} blocks` : ""}): ${pctStr(base)} of prompt tokens hit.`,
  });
  if (own) {
    for (const p of own.points) {
      if (p.factor === 1) continue;
      const size = p.factor === 2 ? "2× the blocks" : p.factor === 0.5 ? "Half the blocks" : `${factorLabel(p.factor)} the blocks`;
      out.push({
        kind: "capacity",
        policy: own.policy,
        factor: p.factor,
        delta: p.hit_rate - base,
        text: `${size} (${nf.format(p.capacity)}): ${pctStr(p.hit_rate)}, ${pts(p.hit_rate - base)}.`,
      });
    }
  }
  for (const pol of curve.policies) {
    if (pol.policy === ownPolicy) continue;
    const p = pol.points.find((q) => q.factor === 1);
    if (!p) continue;
    out.push({
      kind: "policy",
      policy: pol.policy,
      factor: 1,
      delta: p.hit_rate - base,
      text: `Evicting ${pol.policy} at 1×: ${pctStr(p.hit_rate)}, ${pts(p.hit_rate - base)}.`,
    });
  }
  return out;
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
