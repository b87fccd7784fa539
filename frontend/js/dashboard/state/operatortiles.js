// @ts-check
// The stat tiles an operator compares with Grafana, without DOM (node tests
// import it): the prefix hit rate over 1 and 5 minutes (the server computes
// them as Prometheus' rate() of vLLM's two counters), since start (or the
// last prefix-cache reset: all three restart then), usage also as the 0-1
// fraction of vllm:kv_cache_usage_perc, running and waiting requests.

const promql = (/** @type {string} */ w) => `rate(vllm:prefix_cache_hits_total[${w}]) / rate(vllm:prefix_cache_queries_total[${w}])`;

/** [key, label, title]: the tiles this module fills (ids stat-<key>). */
export const OPERATOR_TILES = [
  ["usage01", "usage 0–1", "vllm:kv_cache_usage_perc: blocks in use / usable blocks as a 0-1 fraction (Grafana's panels show this number)"],
  ["hit1m", "hit rate 1m", `prompt tokens hit / queried over the last minute, as Grafana's ${promql("1m")} (samples once a second); restarts on a prefix-cache reset`],
  ["hit5m", "hit rate 5m", `the same over 5 minutes: ${promql("5m")}`],
  ["hit", "since start", "prompt tokens hit / queried since the server started, or since the last prefix-cache reset: vllm:prefix_cache_hits / vllm:prefix_cache_queries"],
  ["requests", "running", "vllm:num_requests_running: admitted requests holding blocks (a REST-admitted request runs until it is finished)"],
  ["waiting", "waiting", "vllm:num_requests_waiting: requests of the demo or a trace replay that arrived but are not admitted yet (too few free blocks, or the workload's running limit)"],
];

/** Why a hit rate has no value (as Grafana's rate() ratio has none then). */
export const NO_RATE = "no rate: under two samples in the window, or no prompt token looked up in it (hits / queries = 0 / 0)";

const finite = (/** @type {unknown} */ v) => (typeof v === "number" && Number.isFinite(v) ? v : null);

/**
 * The tiles' values from the latest series point (`hit_rate_1m`, `…_5m`,
 * `hit_rate_since`, `waiting`) and the frame header (`running_requests`,
 * `waiting_requests`, `requests_reason`, `prefix_cache` for a server without
 * the point fields).
 * -> {key: {value, text, reason?}} with text "—" where there is no figure;
 * running and waiting not known (null, with the server's `requests_reason`)
 * have `reason` and text "not known".  `mirrorWhy`: on a mirror, the reason
 * for a server that sends no `requests_reason` at all (an older one, whose
 * running and waiting are defaults, not the engine's).
 * @param {{hit_rate_1m?: number | null, hit_rate_5m?: number | null, hit_rate_since?: number | null, waiting?: number | null} | null | undefined} point
 * @param {{running_requests?: number | null, waiting_requests?: number | null, requests_reason?: string | null, prefix_cache?: {queries_tokens: number, hits_tokens: number}} | null | undefined} header
 * @param {(x: number) => string} pct
 * @param {(n: number) => string} int
 * @param {string | null} [mirrorWhy]
 * @returns {Record<string, {value: number | null, text: string, reason?: string}>}
 */
export function operatorValues(point, header, pct, int, mirrorWhy = null) {
  const p = point || {};
  const hd = header || {};
  const pc = hd.prefix_cache || { queries_tokens: 0, hits_tokens: 0 };
  const since = finite(p.hit_rate_since) ?? (pc.queries_tokens ? pc.hits_tokens / pc.queries_tokens : null);
  /** @type {(v: number | null | undefined) => {value: number | null, text: string, reason?: string}} */
  const rate = (v) => {
    const f = finite(v);
    return f === null ? { value: null, text: "—", reason: NO_RATE } : { value: f, text: pct(f) };
  };
  const told = "requests_reason" in hd; // the server says whether it knows them
  const why = hd.requests_reason || (told ? "the server does not know it" : mirrorWhy);
  /** @type {(v: number | null | undefined, given: boolean) => {value: number | null, text: string, reason?: string}} */
  const count = (v, given) => {
    if ((told && given && v === null) || (!told && mirrorWhy)) return { value: null, text: "not known", reason: why || "" };
    const f = finite(v);
    return { value: f, text: f === null ? "—" : int(f) };
  };
  const waitingGiven = "waiting_requests" in hd;
  return {
    hit1m: rate(p.hit_rate_1m),
    hit5m: rate(p.hit_rate_5m),
    hit: rate(since),
    requests: count(hd.running_requests, "running_requests" in hd),
    waiting: count(waitingGiven ? hd.waiting_requests : p.waiting, waitingGiven || "waiting" in p),
  };
}

/**
 * The since tile's label from a series point: "since reset" once the prefix cache was reset (null: not said).
 * @param {{hit_rate_resets?: number} | null | undefined} point
 */
export function sinceLabel(point) {
  const n = point && point.hit_rate_resets;
  if (typeof n !== "number" || !Number.isFinite(n)) return null;
  return n > 0 ? "since reset" : "since start";
}

/**
 * Usage as vllm:kv_cache_usage_perc reports it: the 0-1 fraction.
 * @param {number | null | undefined} usage
 */
export function usageText(usage) {
  const u = finite(usage);
  return u === null ? "—" : u.toFixed(3);
}
