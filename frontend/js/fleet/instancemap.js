// @ts-check
// One instance's hash map kept in the page: the browser twin of the
// observer's InstanceState (blockpool/kvevents/state.py), loaded from
// GET /api/fleet/{name}/snapshot and then changed by the stream's events
// alone.  Every event carries its place in the pool's event log (`seq`,
// consecutive from 1 per instance): those at or before the snapshot's
// `event_log_seq` are in it already, and a missing one means the map can no
// longer follow (the caller re-reads).

/**
 * One held hash, as the snapshot's items (GET /api/fleet/{name}/hashmap's shape).
 * @typedef {object} MapEntry
 * @property {string} hash
 * @property {string | null} hash_int
 * @property {string | null} parent
 * @property {number} copies
 * @property {Object<string, number>} media copies per medium ("-": none given)
 * @property {Object<string, number>} groups copies per KV-cache group ("-": none given)
 * @property {number} block_size
 * @property {number} num_tokens
 * @property {number[]} tokens the first ones
 * @property {number | null} lora_id
 * @property {string | null} lora_name
 * @property {number} stored_seq the publisher's batch seq of its first BlockStored
 */

/**
 * What GET /api/fleet/{name}/snapshot answers.
 * @typedef {{instance: string, exact: boolean, event_log_seq: number, state_resets: number, max_keys: number | null, total_keys: number, blocks: number, truncated: boolean, items: MapEntry[]}} Snapshot
 */

const TOKENS_KEPT = 16;

/** @param {Object<string, number>} counts @param {string} key */
function take(counts, key) {
  const n = (counts[key] || 0) - 1;
  if (n > 0) counts[key] = n;
  else delete counts[key];
}

/** @param {Object<string, number>} counts @param {string} key */
function add(counts, key) {
  counts[key] = (counts[key] || 0) + 1;
}

/**
 * The key a removal takes a copy from: the one named when held, else the
 * only one held (an older publisher leaving the field out); null otherwise
 * (python's `_which`).
 * @param {Object<string, number>} counts
 * @param {string} key
 */
function which(counts, key) {
  if (key in counts) return key;
  const keys = Object.keys(counts);
  return keys.length === 1 ? keys[0] : null;
}

/** The decimal form of a 64-bit hash's 16 hex digits (the REST's hash_int). @param {string} hex */
function decimal(hex) {
  return hex.length === 16 ? BigInt(`0x${hex}`).toString() : null;
}

export class InstanceMap {
  constructor() {
    /** @type {Map<string, MapEntry>} in the order first stored (the observer's dict order) */
    this.entries = new Map();
    this.blocks = 0;
    this.multi = 0;
    /** @type {number | null} the last event of the log applied (null: no snapshot yet) */
    this.logSeq = null;
    this.resets = 0;
    /** @type {number | null} */
    this.maxKeys = null;
    this.truncated = false;
  }

  /** @param {Snapshot} snap */
  load(snap) {
    this.entries.clear();
    this.blocks = 0;
    this.multi = 0;
    for (const it of snap.items) {
      this.entries.set(it.hash, { ...it, media: { ...it.media }, groups: { ...it.groups } });
      this.blocks += it.copies;
      if (it.copies > 1) this.multi += 1;
    }
    this.logSeq = snap.event_log_seq;
    this.resets = snap.state_resets;
    this.maxKeys = snap.max_keys;
    this.truncated = snap.truncated;
  }

  /**
   * Apply one event of the stream (in seq order).
   * @param {import("./api.js").FleetEvent} ev
   * @returns {"applied" | "old" | "gap"} old: the snapshot holds it already; gap: one before it is missing (nothing applied)
   */
  apply(ev) {
    if (this.logSeq === null || ev.seq <= this.logSeq) return "old";
    if (ev.seq !== this.logSeq + 1) return "gap";
    this.logSeq = ev.seq;
    if (ev.type === "BlockStored") this.stored(ev);
    else if (ev.type === "BlockRemoved") this.removed(ev);
    else if (ev.type === "AllBlocksCleared") {
      this.entries.clear();
      this.blocks = 0;
      this.multi = 0;
    }
    return "applied";
  }

  /** @param {import("./api.js").FleetEvent} ev */
  stored(ev) {
    const medium = ev.medium === null || ev.medium === undefined ? "-" : ev.medium;
    const group = ev.group_idx === null || ev.group_idx === undefined ? "-" : String(ev.group_idx);
    const size = ev.block_size || 0;
    const tokens = ev.token_ids || [];
    const total = ev.num_tokens || 0;
    (ev.block_hashes || []).forEach((hash, i) => {
      const e = this.entries.get(hash);
      if (e) {
        if (e.copies === 1) this.multi += 1;
        e.copies += 1;
        add(e.media, medium);
        add(e.groups, group);
        this.blocks += 1;
        return;
      }
      if (this.maxKeys !== null && this.entries.size >= this.maxKeys) return; // over the observer's cap: it keeps none either
      const start = i * size;
      this.entries.set(hash, {
        hash,
        hash_int: decimal(hash),
        parent: i === 0 ? (ev.parent_block_hash ?? null) : (ev.block_hashes || [])[i - 1],
        copies: 1,
        media: { [medium]: 1 },
        groups: { [group]: 1 },
        block_size: size,
        num_tokens: size ? Math.max(0, Math.min(size, total - start)) : 0,
        tokens: size ? tokens.slice(start, Math.min(start + size, start + TOKENS_KEPT)) : [],
        lora_id: ev.lora_id ?? null,
        lora_name: ev.lora_name ?? null,
        stored_seq: ev.batch_seq,
      });
      this.blocks += 1;
    });
  }

  /** @param {import("./api.js").FleetEvent} ev */
  removed(ev) {
    const medium = ev.medium === null || ev.medium === undefined ? "-" : ev.medium;
    const group = ev.group_idx === null || ev.group_idx === undefined ? "-" : String(ev.group_idx);
    for (const hash of ev.block_hashes || []) {
      const e = this.entries.get(hash);
      if (!e) continue;
      const m = which(e.media, medium);
      const g = which(e.groups, group);
      if (m === null || g === null) continue;
      take(e.media, m);
      take(e.groups, g);
      e.copies -= 1;
      if (e.copies === 1) this.multi -= 1;
      this.blocks -= 1;
      if (e.copies <= 0) this.entries.delete(hash);
    }
  }

  /** Blocks holding a hash now (0: not held). @param {string} hash */
  copies(hash) {
    const e = this.entries.get(hash);
    return e ? e.copies : 0;
  }

  /** hash -> depth from its root among held hashes (1: a root). */
  depths() {
    /** @type {Map<string, number>} */
    const out = new Map();
    for (const start of this.entries.keys()) {
      if (out.has(start)) continue;
      /** @type {string[]} */
      const path = [];
      /** @type {string | null} */
      let cur = start;
      let base = 0;
      const seen = new Set();
      while (cur !== null && this.entries.has(cur) && !seen.has(cur)) {
        const known = out.get(cur);
        if (known !== undefined) {
          base = known;
          break;
        }
        seen.add(cur);
        path.push(cur);
        const e = this.entries.get(cur);
        cur = e ? e.parent : null;
      }
      for (let i = path.length - 1; i >= 0; i--) out.set(path[i], base + (path.length - i));
    }
    return out;
  }
}
