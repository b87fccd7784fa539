// @ts-check
// PoolModel: applies stream frames and keeps an exact copy of the pool,
// exactly as app/stream/replica.py does (the reference).
//
// Columns are TypedArrays (a snapshot's views are kept as they are); a delta
// writes its rows at `ids`.  Which columns there are comes from the config
// frame's `block_columns` ([name, dtype] pairs): each is kept in the field of
// its name in camelCase (`ref_cnt` -> `refCnt`).  Changed ids are queued for the renderer, and the
// hash index is kept up to date on the way.  Views: queue order from stamps,
// the hash map grouped by (hash64, group), counts.

import { CACHED, CONFIG, DELTA, EMPTY, ProtocolError, SNAPSHOT } from "../wire/protocol.js";
import { HashIndex } from "./hashindex.js";

/** @typedef {import("../wire/protocol.js").Frame} Frame */
/** @typedef {import("../wire/protocol.js").FrameHeader} FrameHeader */
/** @typedef {import("../wire/protocol.js").Column} Column */
/** @typedef {"config" | "snapshot" | "delta"} FrameKind */
/** @typedef {(frame: Frame, model: PoolModel) => void} FrameListener */
/**
 * What apply() made of a frame; `expected` and `got` with a gap.
 * @typedef {{status: "config" | "snapshot" | "applied" | "ignored"} | {status: "gap", expected: number, got: number}} ApplyResult
 */

export class PoolModel {
  /** @param {{keepEvents?: number, keepPoints?: number, hashIndex?: boolean}} [opts] */
  constructor({ keepEvents = 5000, keepPoints = 6000, hashIndex = true } = {}) {
    this.keepEvents = keepEvents;
    this.keepPoints = keepPoints;
    /** @type {import("../wire/protocol.js").PoolConfig | null} */
    this.config = null;
    /** @type {string | null} */
    this.epoch = null;
    /** @type {number | null} */
    this.seq = null; // last applied frame (null: no snapshot yet)
    this.n = 0;
    /** @type {[string, string, string][]} */
    this.blockColumns = []; // [wire name, dtype, field] from the config frame
    this.state = new Uint8Array(0);
    this.refCnt = new Int32Array(0);
    this.hashed = new Uint8Array(0);
    this.hash64 = new Uint32Array(0); // [lo, hi] pairs
    this.group = new Uint32Array(0);
    this.stamp = new Float64Array(0);
    /** @type {FrameHeader} the last snapshot's header, each delta's fields written over it (no columns, series, recent events) */
    this.header = {};
    /** @type {Record<string, import("../wire/protocol.js").Histogram> | null} */
    this.histograms = null;
    /** @type {import("../wire/protocol.js").WireEvent[]} */
    this.events = [];
    /** @type {import("../wire/protocol.js").SeriesPoint[]} */
    this.points = [];
    this.snapshots = 0;
    this.deltas = 0;
    this.gaps = 0;
    this.ignored = 0;
    this.eventsOmitted = 0;
    this.changedTotal = 0; // block rows written by deltas
    /** @type {number | null} */
    this.lastTs = null;
    this.index = hashIndex ? new HashIndex(0) : null;
    // Renderer feed: ids changed since the last drain (deduplicated).
    this.fullDirty = true;
    this._dirtyFlag = new Uint8Array(0);
    this._dirty = new Uint32Array(1024);
    this._dirtyCount = 0;
    /** @type {Record<FrameKind, FrameListener[]>} */
    this.listeners = { config: [], snapshot: [], delta: [] };
  }

  /**
   * @param {FrameKind} kind
   * @param {FrameListener} fn
   */
  on(kind, fn) {
    this.listeners[kind].push(fn);
  }

  /**
   * @param {FrameKind} kind
   * @param {Frame} frame
   */
  _emit(kind, frame) {
    for (const fn of this.listeners[kind]) fn(frame, this);
  }

  get nextSeq() {
    return this.seq === null ? null : this.seq + 1;
  }

  /**
   * Apply one decoded frame.  Returns {status}: "config", "snapshot",
   * "applied", "ignored" (old or before a snapshot), or "gap" with
   * `expected` (send {"type":"resume","from":expected}) and `got`.
   * @param {Frame} frame
   * @returns {ApplyResult}
   */
  apply(frame) {
    if (frame.kind === CONFIG) {
      const epoch = frame.header.epoch ?? null;
      if (this.epoch !== null && epoch !== this.epoch) this.seq = null; // another server
      this.epoch = epoch;
      this.config = frame.header.config ?? null;
      this.blockColumns = (frame.header.block_columns || []).map(([name, dtype]) => [name, dtype, fieldOf(name)]);
      this._emit("config", frame);
      return { status: "config" };
    }
    if (frame.kind === SNAPSHOT) {
      this._applySnapshot(frame);
      this._emit("snapshot", frame);
      return { status: "snapshot" };
    }
    if (frame.kind === DELTA) {
      if (this.seq === null || frame.seq <= this.seq) {
        this.ignored++;
        return { status: "ignored" };
      }
      if (frame.seq !== this.seq + 1) {
        this.gaps++;
        return { status: "gap", expected: this.seq + 1, got: frame.seq };
      }
      this._applyDelta(frame);
      this._emit("delta", frame);
      return { status: "applied" };
    }
    return { status: "ignored" };
  }

  /**
   * The block columns, by their field (the config frame names them).
   * @returns {Record<string, Column>}
   */
  _columnFields() {
    return /** @type {Record<string, Column>} */ (/** @type {unknown} */ (this));
  }

  /** @param {Frame} frame */
  _applySnapshot(frame) {
    const c = frame.columns;
    if (!this.blockColumns.length) throw new ProtocolError("a snapshot before the config frame");
    for (const [name] of this.blockColumns) {
      if (!c[name]) throw new ProtocolError(`the snapshot has no ${name} column`);
    }
    const fields = this._columnFields();
    for (const [name, , field] of this.blockColumns) fields[field] = c[name];
    const n = this.state.length;
    if (n !== this.n) {
      this.n = n;
      this._dirtyFlag = new Uint8Array(n);
    } else {
      this._dirtyFlag.fill(0);
    }
    this._dirtyCount = 0;
    this.fullDirty = true;
    if (this.index) this.index.rebuild(this.hashed, this.hash64, this.group);
    const h = frame.header;
    this.header = stripKeys(h, BULKY);
    this.histograms = h.histograms || null;
    this.seq = frame.seq;
    this.events = (h.recent_events || []).slice(-this.keepEvents);
    this.points = (h.series || []).slice(-this.keepPoints);
    this.lastTs = this.points.length ? this.points[this.points.length - 1].ts : null;
    this.snapshots++;
  }

  /** @param {Frame} frame */
  _applyDelta(frame) {
    const c = frame.columns;
    const ids = c.ids;
    if (ids && ids.length) {
      const m = ids.length;
      for (const [name] of this.blockColumns) {
        if (!c[name]) throw new ProtocolError(`the delta has no ${name} column`);
      }
      const index = this.index;
      if (index) {
        const { hashed, hash64, group } = this;
        const hs = c.hashed;
        const hh = c.hash64;
        const gr = c.group;
        for (let i = 0; i < m; i++) {
          const id = ids[i];
          const lo = hh[2 * i];
          const hi = hh[2 * i + 1];
          const g = gr[i];
          const oldHashed = hashed[id];
          const newHashed = hs[i];
          const same =
            oldHashed && newHashed && hash64[2 * id] === lo && hash64[2 * id + 1] === hi && group[id] === g;
          if (!same) {
            if (oldHashed) index.remove(id);
            if (newHashed) index.add(id, lo, hi, g);
          }
        }
      }
      const fields = this._columnFields();
      for (const [name, , field] of this.blockColumns) {
        const src = c[name];
        const dst = fields[field];
        if (src.length === m) {
          for (let i = 0; i < m; i++) dst[ids[i]] = src[i];
        } else {
          // u64: [lo, hi] pairs
          for (let i = 0; i < m; i++) {
            dst[2 * ids[i]] = src[2 * i];
            dst[2 * ids[i] + 1] = src[2 * i + 1];
          }
        }
      }
      for (let i = 0; i < m; i++) this._markDirty(ids[i]);
      this.changedTotal += m;
    }
    const h = frame.header;
    Object.assign(this.header, stripKeys(h, DELTA_KEPT_OUT));
    if (h.histograms) this.histograms = h.histograms;
    if (h.events && h.events.length) {
      const ev = this.events;
      for (const e of h.events) ev.push(e);
      if (ev.length > this.keepEvents * 1.25) ev.splice(0, ev.length - this.keepEvents);
    }
    this.eventsOmitted += h.events_omitted || 0;
    if (h.point) {
      this.points.push(h.point);
      if (this.points.length > this.keepPoints * 1.25) {
        this.points.splice(0, this.points.length - this.keepPoints);
      }
    }
    if (h.ts !== undefined) this.lastTs = h.ts;
    this.seq = frame.seq;
    this.deltas++;
  }

  /** @param {number} id */
  _markDirty(id) {
    if (this._dirtyFlag[id]) return;
    this._dirtyFlag[id] = 1;
    if (this._dirtyCount === this._dirty.length) {
      const grown = new Uint32Array(this._dirty.length * 2);
      grown.set(this._dirty);
      this._dirty = grown;
    }
    this._dirty[this._dirtyCount++] = id;
  }

  /**
   * Mark ids for a redraw (e.g. their highlight changed).
   * @param {Iterable<number>} ids
   */
  touch(ids) {
    for (const id of ids) if (id < this.n) this._markDirty(id);
  }

  /** @param {number} id */
  touchOne(id) {
    if (id < this.n) this._markDirty(id);
  }

  /**
   * Hand the renderer what changed: fn(full, ids, count).  `ids` is only
   * valid during the call.
   * @param {(full: boolean, ids: Uint32Array, count: number) => void} fn
   */
  drainDirty(fn) {
    const full = this.fullDirty;
    const count = this._dirtyCount;
    fn(full, this._dirty, count);
    for (let i = 0; i < count; i++) this._dirtyFlag[this._dirty[i]] = 0;
    this._dirtyCount = 0;
    this.fullDirty = false;
  }

  // ------------------------------------------------------------ views

  /** Counts per state, computed from the columns. */
  countStates() {
    const c = [0, 0, 0, 0];
    const s = this.state;
    for (let i = 0; i < s.length; i++) c[s[i]]++;
    return { null: c[0], in_use: c[1], cached: c[2], empty: c[3] };
  }

  /** Free block ids from head (next to be evicted) to tail: free sorted by (stamp, id). */
  queueOrder() {
    const { state, stamp } = this;
    /** @type {number[]} */
    const ids = [];
    for (let i = 0; i < state.length; i++) {
      const s = state[i];
      if (s === CACHED || s === EMPTY) ids.push(i);
    }
    ids.sort((a, b) => stamp[a] - stamp[b] || a - b);
    return ids;
  }

  /**
   * The first k ids of the queue without sorting it all (a bounded max-heap).
   * @param {number} k
   */
  queueHead(k) {
    const { state, stamp } = this;
    const hs = new Float64Array(k);
    const hid = new Uint32Array(k);
    let size = 0;
    /** @type {(sa: number, ia: number, sb: number, ib: number) => boolean} */
    const greater = (sa, ia, sb, ib) => sa > sb || (sa === sb && ia > ib);
    for (let id = 0; id < state.length; id++) {
      const s = state[id];
      if (s !== CACHED && s !== EMPTY) continue;
      const st = stamp[id];
      if (size < k) {
        // push, sift up
        let i = size++;
        while (i > 0) {
          const p = (i - 1) >> 1;
          if (!greater(st, id, hs[p], hid[p])) break;
          hs[i] = hs[p];
          hid[i] = hid[p];
          i = p;
        }
        hs[i] = st;
        hid[i] = id;
      } else if (k > 0 && greater(hs[0], hid[0], st, id)) {
        // replace the largest, sift down
        let i = 0;
        for (;;) {
          const l = 2 * i + 1;
          if (l >= size) break;
          const r = l + 1;
          const c = r < size && greater(hs[r], hid[r], hs[l], hid[l]) ? r : l;
          if (!greater(hs[c], hid[c], st, id)) break;
          hs[i] = hs[c];
          hid[i] = hid[c];
          i = c;
        }
        hs[i] = st;
        hid[i] = id;
      }
    }
    const out = Array.from(hid.subarray(0, size));
    out.sort((a, b) => stamp[a] - stamp[b] || a - b);
    return out;
  }

  /**
   * The whole queue as a profile: the free blocks' states in queue order
   * (1 = cached, 0 = empty), from one numeric sort of packed keys.
   */
  queueProfile() {
    const { state, stamp } = this;
    let free = 0;
    for (let i = 0; i < state.length; i++) if (state[i] === CACHED || state[i] === EMPTY) free++;
    const keys = new Float64Array(free);
    let j = 0;
    for (let i = 0; i < state.length; i++) {
      const s = state[i];
      if (s === CACHED || s === EMPTY) keys[j++] = stamp[i] * 2 + (s === CACHED ? 1 : 0);
    }
    keys.sort();
    const cached = new Uint8Array(free);
    // stamps below 0 (blocks put at the queue's head) make negative keys:
    // take the parity of the key's magnitude
    for (let i = 0; i < free; i++) cached[i] = Math.abs(keys[i] % 2);
    return cached;
  }

  /**
   * 0-based queue position of a free block (null if not free).
   * @param {number} id
   */
  queuePosition(id) {
    const { state, stamp } = this;
    const s = state[id];
    if (s !== CACHED && s !== EMPTY) return null;
    const st = stamp[id];
    let pos = 0;
    for (let i = 0; i < state.length; i++) {
      const t = state[i];
      if ((t === CACHED || t === EMPTY) && (stamp[i] < st || (stamp[i] === st && i < id))) pos++;
    }
    return pos;
  }

  /** hash map: Map "hex16/group" -> sorted ids (small pools, tests). */
  hashMap() {
    /** @type {Map<string, number[]>} */
    const out = new Map();
    const { hashed, hash64, group } = this;
    for (let i = 0; i < hashed.length; i++) {
      if (!hashed[i]) continue;
      const key = `${hash64[2 * i + 1].toString(16).padStart(8, "0")}${hash64[2 * i]
        .toString(16)
        .padStart(8, "0")}/${group[i]}`;
      const ids = out.get(key);
      if (ids) ids.push(i);
      else out.set(key, [i]);
    }
    return out;
  }
}

/**
 * A wire column's field on the model: its name in camelCase.
 * @param {string} name
 */
function fieldOf(name) {
  return name.replace(/_([a-z0-9])/g, (_, /** @type {string} */ ch) => ch.toUpperCase());
}

const BULKY = new Set(["columns", "series", "recent_events"]);
const DELTA_KEPT_OUT = new Set(["columns"]);

/**
 * The header without the fields in `drop`.
 * @param {FrameHeader} h
 * @param {Set<string>} drop
 * @returns {FrameHeader}
 */
function stripKeys(h, drop) {
  return Object.fromEntries(Object.entries(h).filter(([k]) => !drop.has(k)));
}
