// @ts-check
// The stream's wire format (docs/protocol.md): one binary envelope per frame.
//
//   0  magic "BPS1" | 4 kind | 5 reserved | 8 seq u64 | 16 H u32 | 20 B u32
//   24 header (JSON, H bytes) | 24+H body (columns, 8-byte aligned)
//
// decodeFrame() makes no per-block objects: every column is a TypedArray view
// on the frame's own buffer (u64 columns as pairs of u32: [lo, hi, lo, hi...]).

export const CONFIG = 1;
export const SNAPSHOT = 2;
export const DELTA = 3;
/** @type {Record<number, string>} */
export const KIND_NAMES = { 1: "config", 2: "snapshot", 3: "delta" };
export const EV_STORED = 0;
export const EV_REMOVED = 1;
export const EV_CLEARED = 2;
/** @type {Record<number, string>} */
export const EVENT_NAMES = { 0: "BlockStored", 1: "BlockRemoved", 2: "AllBlocksCleared" };
export const STATE_NAMES = ["null", "in_use", "cached", "empty"];
export const NULL = 0;
export const IN_USE = 1;
export const CACHED = 2;
export const EMPTY = 3;

const HEAD = 24;
const MAGIC = [0x42, 0x50, 0x53, 0x31]; // "BPS1"
const textDecoder = new TextDecoder();

export class ProtocolError extends Error {}

// dtype -> [TypedArray constructor, elements per value]
/** @typedef {{new (buffer: ArrayBufferLike, byteOffset: number, length: number): Column, BYTES_PER_ELEMENT: number}} ColumnArray */
/** @type {Record<string, [ColumnArray, number]>} */
const DTYPES = {
  u8: [Uint8Array, 1],
  i32: [Int32Array, 1],
  u32: [Uint32Array, 1],
  u64: [Uint32Array, 2],
  f64: [Float64Array, 1],
};

/**
 * The service's settings, as the config frame's `config` carries them
 * (app/pool/views/summary.py `config`).
 * @typedef {object} PoolConfig
 * @property {number} num_blocks
 * @property {number} block_size
 * @property {number} [hash_block_size]
 * @property {number} num_groups
 * @property {string} hash_fn
 * @property {boolean} enable_caching
 * @property {boolean} enable_events
 * @property {number} metrics_sample_rate
 * @property {boolean} strict
 * @property {string | null} [model_name]
 * @property {number} tick_hz
 * @property {boolean} auth_required_for_writes
 * @property {boolean} [auth_required_for_reads]
 * @property {Record<string, number>} [limits] input size limits
 * @property {Record<string, unknown>} [storage]
 */

/** @typedef {{null: number, in_use: number, cached: number, empty: number}} BlockCounts */

/** @typedef {{requests: number, queries_tokens: number, hits_tokens: number, hit_rate: number | null}} PrefixCacheCounts */

/**
 * One time-series point (`point` of a delta, `series` of a snapshot);
 * null where there is no value yet.
 * @typedef {object} SeriesPoint
 * @property {number} ts
 * @property {number} in_use
 * @property {number} cached
 * @property {number} empty
 * @property {number} usage
 * @property {number | null} hit_rate
 * @property {number | null} hit_rate_total
 * @property {number | null} alloc_per_s
 * @property {number | null} evict_per_s
 * @property {number} requests
 * @property {number | null} [hit_rate_1m]
 * @property {number | null} [hit_rate_5m]
 * @property {number | null} [hit_rate_since]
 * @property {number} [hit_rate_resets]
 * @property {number | null} [waiting]
 */

/**
 * One eviction-sample histogram: `counts` per bucket (not cumulative), the
 * last one counting values above the last bound.
 * @typedef {{buckets: number[], counts: number[], sum: number, count: number}} Histogram
 */

/**
 * One KV event as the stream carries it: `[seq, 0, hashes, parent, num_tokens,
 * block_size, lora_name]` (BlockStored), `[seq, 1, hashes]` (BlockRemoved),
 * `[seq, 2]` (AllBlocksCleared).
 * @typedef {[number, 0, string[], string | null, number, number, string | null] | [number, 1, string[]] | [number, 2]} WireEvent
 */

/** @typedef {[number, number, number, number[]]} WireSample [seq, lifetime s, idle s, reuse gaps s] */

/**
 * The stream's own figures (`stream` of every snapshot and delta).
 * @typedef {object} StreamStats
 * @property {number} seq
 * @property {number} clients
 * @property {number} [frames_total]
 * @property {number} [bytes_total]
 * @property {number} [drops_total]
 * @property {number} [resyncs_total]
 * @property {number} [snapshots_total]
 * @property {number} [resumes_total]
 * @property {number} [refused_total]
 * @property {number} max_lag_frames
 * @property {number} ring_frames
 */

/** @typedef {[string, string, number, number]} WireColumn [name, dtype, count, byte offset in the body] */

/**
 * A frame's JSON header (docs/protocol.md).  One shape for the three kinds,
 * every field optional: which ones a frame has depends on its kind and on
 * the channels asked for.  config: protocol .. block_columns; snapshot:
 * as_of .. analysis_enabled and the counts; delta: tick, ts, events ..
 * samples and the counts.
 * @typedef {object} FrameHeader
 * @property {number} [protocol]
 * @property {string} [epoch] the server's epoch (a restart changes it)
 * @property {number} [seq]
 * @property {PoolConfig} [config]
 * @property {string[]} [channels]
 * @property {[string, string][]} [block_columns] [name, dtype] of every block column
 * @property {WireColumn[]} [columns]
 * @property {number} [as_of]
 * @property {number} [next_stamp]
 * @property {WireEvent[]} [recent_events]
 * @property {SeriesPoint[]} [series]
 * @property {Record<string, Histogram> | null} [histograms]
 * @property {boolean} [analysis_enabled]
 * @property {number} [tick]
 * @property {number} [ts]
 * @property {WireEvent[]} [events]
 * @property {number} [events_omitted]
 * @property {number} [events_last_seq]
 * @property {SeriesPoint} [point]
 * @property {WireSample[]} [samples]
 * @property {number} [samples_last_seq]
 * @property {StreamStats} [stream]
 * @property {number} [num_blocks]
 * @property {BlockCounts} [blocks]
 * @property {number} [num_free_blocks]
 * @property {number} [usage]
 * @property {number} [hash_map_keys]
 * @property {number | null} [running_requests] null: not known (a mirror; requests_reason says why)
 * @property {number | null} [waiting_requests] null: not known
 * @property {string | null} [requests_reason] why running / waiting are not known (null: known)
 * @property {PrefixCacheCounts} [prefix_cache]
 * @property {import("../state/analysis.js").TokenUsage} [tokens]
 * @property {import("../state/analysis.js").AnalysisSection} [analysis]
 * @property {import("./mirrorlag.js").MirrorHeader} [mirror]
 */

/**
 * One decoded frame: its columns are views on the frame's own buffer.
 * @typedef {object} Frame
 * @property {number} kind CONFIG, SNAPSHOT or DELTA
 * @property {string} kindName
 * @property {number} seq
 * @property {FrameHeader} header
 * @property {Record<string, Column>} columns
 * @property {number} byteLength
 */

/** @typedef {Uint8Array | Int32Array | Uint32Array | Float64Array} Column one block column (u64: [lo, hi] pairs) */

/**
 * Decode one frame.
 * @param {ArrayBuffer|ArrayBufferView} data
 * @returns {Frame}
 */
export function decodeFrame(data) {
  let buf;
  let base;
  let len;
  if (data instanceof ArrayBuffer) {
    buf = data;
    base = 0;
    len = data.byteLength;
  } else if (ArrayBuffer.isView(data)) {
    buf = data.buffer;
    base = data.byteOffset;
    len = data.byteLength;
    if (base % 8 !== 0) {
      // Typed views need aligned offsets: copy once (Node Buffers from a pool).
      const copy = new Uint8Array(len);
      copy.set(new Uint8Array(buf, base, len));
      buf = copy.buffer;
      base = 0;
    }
  } else {
    throw new ProtocolError("a frame must be an ArrayBuffer or a typed view");
  }
  if (len < HEAD) throw new ProtocolError(`frame of ${len} bytes is shorter than the envelope`);
  const bytes = new Uint8Array(buf, base, HEAD);
  for (let i = 0; i < 4; i++) {
    if (bytes[i] !== MAGIC[i]) throw new ProtocolError("bad magic");
  }
  const dv = new DataView(buf, base, HEAD);
  const kind = dv.getUint8(4);
  const seq = dv.getUint32(8, true) + dv.getUint32(12, true) * 4294967296;
  const hlen = dv.getUint32(16, true);
  const blen = dv.getUint32(20, true);
  if (HEAD + hlen + blen !== len) {
    throw new ProtocolError("frame length does not match its envelope");
  }
  /** @type {FrameHeader} */
  const header = JSON.parse(textDecoder.decode(new Uint8Array(buf, base + HEAD, hlen)));
  const bodyStart = base + HEAD + hlen;
  /** @type {Record<string, Column>} */
  const columns = {};
  for (const [name, dtype, count, offset] of header.columns || []) {
    const spec = DTYPES[dtype];
    if (!spec) throw new ProtocolError(`unknown dtype ${dtype}`);
    const [Ctor, per] = spec;
    const start = bodyStart + offset;
    if (offset + count * per * Ctor.BYTES_PER_ELEMENT > blen) {
      throw new ProtocolError(`column ${name} runs past the body`);
    }
    if (start % Ctor.BYTES_PER_ELEMENT !== 0) {
      throw new ProtocolError(`column ${name} is not aligned`);
    }
    columns[name] = new Ctor(buf, start, count * per);
  }
  return { kind, kindName: KIND_NAMES[kind] || String(kind), seq, header, columns, byteLength: len };
}

/** @type {string[]} */
const HEX = [];
for (let i = 0; i < 256; i++) HEX.push(i.toString(16).padStart(2, "0"));

/**
 * The 16-hex-digit form of a u64 given as (lo, hi) u32 halves.
 * @param {number} lo
 * @param {number} hi
 */
export function hex64(lo, hi) {
  return (
    HEX[hi >>> 24] +
    HEX[(hi >>> 16) & 255] +
    HEX[(hi >>> 8) & 255] +
    HEX[hi & 255] +
    HEX[lo >>> 24] +
    HEX[(lo >>> 16) & 255] +
    HEX[(lo >>> 8) & 255] +
    HEX[lo & 255]
  );
}

/**
 * Parse an event hash (16 hex digits, or a full digest whose last 16 digits
 * are the 64-bit form) into [lo, hi]; null when it is not hex.
 * @param {unknown} text
 * @returns {[number, number] | null}
 */
export function parseHash64(text) {
  const h = String(text).trim().toLowerCase();
  if (!/^[0-9a-f]{1,128}$/.test(h)) return null;
  const t = h.length > 16 ? h.slice(-16) : h.padStart(16, "0");
  return [parseInt(t.slice(8), 16) >>> 0, parseInt(t.slice(0, 8), 16) >>> 0];
}

/**
 * The 64-bit form of an event hash as shown in the dashboard (16 digits).
 * @param {unknown} text
 */
export function eventHash64(text) {
  const h = String(text).toLowerCase();
  return h.length > 16 ? h.slice(-16) : h.padStart(16, "0");
}
