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
/** @typedef {{new (buffer: ArrayBufferLike, byteOffset: number, length: number): ArrayBufferView, BYTES_PER_ELEMENT: number}} ColumnArray */
/** @type {Record<string, [ColumnArray, number]>} */
const DTYPES = {
  u8: [Uint8Array, 1],
  i32: [Int32Array, 1],
  u32: [Uint32Array, 1],
  u64: [Uint32Array, 2],
  f64: [Float64Array, 1],
};

/**
 * Decode one frame.
 * @param {ArrayBuffer|ArrayBufferView} data
 * @returns {{kind:number, kindName:string, seq:number, header:object, columns:Object<string, ArrayBufferView>, byteLength:number}}
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
  const header = JSON.parse(textDecoder.decode(new Uint8Array(buf, base + HEAD, hlen)));
  const bodyStart = base + HEAD + hlen;
  /** @type {Object<string, ArrayBufferView>} */
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
