// @ts-check
// What more memory, or another eviction order, would buy, client side and
// without DOM (node tests import it): the miss-ratio curve per shadow policy
// from GET /api/shadows or a stream section's shadow rows, and the curve in
// words (the what-if panel).

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
