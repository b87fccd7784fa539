// @ts-check
// Time travel's state, pure (the node tests use it): a recorded moment as a
// source the BlockMap draws, the time of an op seq from the keyframes, what
// the jump box accepts, and a diff as rows.

/** @type {Record<string, number>} */
const STATE_CODE = { null: 0, in_use: 1, cached: 2, empty: 3 };

/**
 * A recorded moment, GET /api/history/state with include_blocks: the fields read here.
 * @typedef {object} HistoryState
 * @property {{state: string[], ref_cnt: number[], hash64: (string | null)[]}} blocks per block
 * @property {{seq: number, ts: number}} at
 * @property {{blocks: {in_use: number, cached: number, empty: number}, running_requests: number | null, requests_reason?: string | null, num_blocks: number, usage: number, hash_map_keys: number}} summary
 * @property {number} keyframe_seq
 * @property {number} replayed_ops
 * @property {{block_ids: number[], total: number}} queue the free queue's head (its first `limit` ids) and its length
 * @property {{items?: {request_id: string, block_ids: (number | number[])[]}[]}} requests the running requests (block ids per group, or flat)
 * @property {MomentTiles} [tiles] the operator tiles at the moment (a server without them: absent)
 */

/**
 * The operator tiles at a recorded moment, from the series point nearest it
 * (`reason`: why there is none).
 * @typedef {object} MomentTiles
 * @property {number | null} [point_ts]
 * @property {string} [reason]
 * @property {number | null} [hit_rate_1m]
 * @property {number | null} [hit_rate_5m]
 * @property {number | null} [hit_rate_since]
 * @property {number | null} [waiting]
 * @property {string} [since_label]
 */

/**
 * A recorded moment the panels follow: its state and the source the map draws.
 * @typedef {{st: HistoryState, src: HistorySource}} Moment
 */

/** A recorded moment as a source the BlockMap can draw (pure; node tests use it). */
export class HistorySource {
  /** @param {HistoryState} state */
  constructor(state) {
    const b = state.blocks;
    const n = b.state.length;
    this.n = n;
    this.seq = state.at.seq;
    this.ts = state.at.ts;
    this.summary = state.summary;
    this.state = new Uint8Array(n);
    this.refCnt = new Int32Array(n);
    for (let i = 0; i < n; i++) {
      this.state[i] = STATE_CODE[b.state[i]] ?? 0;
      this.refCnt[i] = b.ref_cnt[i];
    }
    this.hash64 = b.hash64;
    this.fullDirty = true;
    this.keyframeSeq = state.keyframe_seq;
    this.replayed = state.replayed_ops;
  }

  /**
   * BlockMap's feed: the whole map once, then nothing.
   * @param {(full: boolean, ids: Uint32Array, count: number) => void} fn
   */
  drainDirty(fn) {
    const full = this.fullDirty;
    this.fullDirty = false;
    fn(full, EMPTY, 0);
  }
}
const EMPTY = new Uint32Array(0);

/**
 * Approximate time of an op seq from the keyframes (linear between them).
 * @param {{first_seq: number, first_ts: number, last_seq: number, last_ts: number, keyframes?: {seq: number, ts: number}[]} | null | undefined} info GET /api/history
 * @param {number} seq
 * @returns {number | null}
 */
export function seqTime(info, seq) {
  if (!info) return null;
  /** @type {[number, number][]} */
  const ends = [
    [info.first_seq, info.first_ts],
    ...(info.keyframes || []).map((k) => /** @type {[number, number]} */ ([k.seq, k.ts])),
    [info.last_seq, info.last_ts],
  ];
  const pts = ends
    .filter(([s, t]) => Number.isFinite(s) && Number.isFinite(t))
    .sort((a, b) => a[0] - b[0]);
  if (!pts.length) return null;
  if (seq <= pts[0][0]) return pts[0][1];
  for (let i = 1; i < pts.length; i++) {
    const [s1, t1] = pts[i];
    if (seq <= s1) {
      const [s0, t0] = pts[i - 1];
      return s1 === s0 ? t1 : t0 + ((seq - s0) / (s1 - s0)) * (t1 - t0);
    }
  }
  return pts[pts.length - 1][1];
}

/**
 * What the jump box accepts, as the `at` query value: an op seq ("1200"), a
 * clock time today ("14:02", "14:02:05", local), or anything the server
 * parses (a Unix time, ISO 8601).
 * @param {string} text
 */
export function parseMoment(text, now = new Date()) {
  const t = text.trim();
  if (!t || momentProblem(t)) return null;
  if (/^\d+$/.test(t) && Number(t) < 1e9) return t;
  const m = CLOCK.exec(t);
  if (m) {
    const d = new Date(now.getTime());
    d.setHours(Number(m[1]), Number(m[2]), Number(m[3] || 0), Math.round(Number(m[4] || 0) * 1000));
    return String(d.getTime() / 1000);
  }
  return t;
}

const CLOCK = /^(\d{1,2}):(\d{2})(?::(\d{2})(\.\d+)?)?$/;

/**
 * Why the jump box cannot take `text` (checked here, before any request), or null.
 * @param {unknown} text
 */
export function momentProblem(text) {
  const t = String(text).trim();
  if (!t) return "give a moment: an op seq, a time of day (14:02:05), a Unix or ISO time";
  const m = CLOCK.exec(t);
  if (m && (Number(m[1]) > 23 || Number(m[2]) > 59 || Number(m[3] || 0) > 59)) {
    return `${t} is not a time of day: hh:mm or hh:mm:ss, hours 0–23, minutes and seconds 0–59`;
  }
  if (!m && /^[\d:]+$/.test(t) && t.includes(":")) return `${t} is not a time of day: hh:mm or hh:mm:ss`;
  return null;
}

/** @typedef {{hash64: string, block_id: number}} DiffBlock */

/**
 * The diff as rows: {evicted: [[hash, id]], entered: [[hash, id]], started, ended, ...}.
 * @param {{evicted?: DiffBlock[], entered?: DiffBlock[], requests?: {started?: string[], ended?: string[]}, evicted_total?: number, entered_total?: number}} d GET /api/history/diff
 */
export function diffRows(d) {
  return {
    evicted: (d.evicted || []).map((e) => [e.hash64, e.block_id]),
    entered: (d.entered || []).map((e) => [e.hash64, e.block_id]),
    started: (d.requests && d.requests.started) || [],
    ended: (d.requests && d.requests.ended) || [],
    evictedTotal: d.evicted_total ?? (d.evicted || []).length,
    enteredTotal: d.entered_total ?? (d.entered || []).length,
  };
}
