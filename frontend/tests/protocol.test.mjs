import assert from "node:assert/strict";
import { test } from "node:test";

import { CONFIG, DELTA, ProtocolError, SNAPSHOT, decodeFrame, eventHash64, hex64, parseHash64 } from "../js/dashboard/wire/protocol.js";
import { PoolModel } from "../js/dashboard/state/model.js";
import { loadScenario, toArrayBuffer } from "./fixtures.mjs";

const small = loadScenario("small");
const frame = (i) => decodeFrame(toArrayBuffer(small.frames[i].bytes));

test("config frame: kind, seq, epoch, pool config, no columns", () => {
  const f = frame(0);
  assert.equal(f.kind, CONFIG);
  assert.equal(f.kindName, "config");
  assert.equal(f.seq, small.frames[0].seq);
  assert.equal(f.header.protocol, 1);
  assert.equal(f.header.epoch, small.epoch);
  assert.equal(f.header.config.num_blocks, 64);
  assert.equal(f.header.config.block_size, 4);
  assert.equal(f.header.state_names, undefined); // the page never read it: not sent
  assert.deepEqual(Object.keys(f.columns), []);
});

test("the config frame's block columns are what snapshots and deltas carry, and what the model keeps", () => {
  const declared = frame(0).header.block_columns;
  assert.deepEqual(declared.map(([name]) => name), ["state", "ref_cnt", "hashed", "hash64", "group", "stamp"]);
  const spec = (f) => f.header.columns.map(([name, dtype]) => [name, dtype]);
  assert.deepEqual(spec(frame(1)), declared, "the snapshot's columns, in order");
  const i = small.frames.findIndex((f) => f.note === "admit A");
  assert.deepEqual(spec(frame(i)), [["ids", "u32"], ...declared], "a delta: ids, then the same columns");
  const m = new PoolModel();
  m.apply(frame(0));
  m.apply(frame(1));
  const snap = frame(1);
  for (const [name] of declared) {
    const field = name.replace(/_([a-z])/g, (_, ch) => ch.toUpperCase());
    assert.deepEqual(Array.from(m[field]), Array.from(snap.columns[name]), `model.${field} holds ${name}`);
  }
});

test("a snapshot missing a declared column is refused", () => {
  const m = new PoolModel();
  const config = frame(0);
  m.apply({ ...config, header: { ...config.header, block_columns: [...config.header.block_columns, ["extra", "u8"]] } });
  assert.throws(() => m.apply(frame(1)), ProtocolError);
  assert.equal(m.seq, null, "nothing applied");
});

test("snapshot frame: every column as a typed view of the right length", () => {
  const f = frame(1);
  assert.equal(f.kind, SNAPSHOT);
  assert.equal(f.seq, f.header.as_of);
  const c = f.columns;
  assert.ok(c.state instanceof Uint8Array && c.state.length === 64);
  assert.ok(c.ref_cnt instanceof Int32Array && c.ref_cnt.length === 64);
  assert.ok(c.hashed instanceof Uint8Array && c.hashed.length === 64);
  assert.ok(c.hash64 instanceof Uint32Array && c.hash64.length === 128, "u64 as u32 pairs");
  assert.ok(c.group instanceof Uint32Array && c.group.length === 64);
  assert.ok(c.stamp instanceof Float64Array && c.stamp.length === 64);
  assert.equal(c.ids, undefined, "snapshots have no ids: row i is block i");
  assert.deepEqual(Array.from(c.state), small.frames[1].expect.state);
  assert.deepEqual(Array.from(c.stamp), small.frames[1].expect.stamp);
  // zero-copy: the columns are views on the frame's buffer
  assert.equal(c.state.buffer, c.stamp.buffer);
});

test("delta frame: ids plus each changed block's final columns, events, point", () => {
  const i = small.frames.findIndex((f) => f.note === "admit A");
  const f = frame(i);
  assert.equal(f.kind, DELTA);
  assert.equal(f.columns.ids.length, small.frames[i].ids);
  assert.ok(f.columns.ids instanceof Uint32Array);
  for (const name of ["state", "ref_cnt", "hashed", "group", "stamp"]) {
    assert.equal(f.columns[name].length, f.columns.ids.length, name);
  }
  assert.equal(f.columns.hash64.length, 2 * f.columns.ids.length);
  assert.ok(Array.isArray(f.header.events) && f.header.events.length > 0);
  const stored = f.header.events.find((e) => e[1] === 0);
  assert.ok(stored, "admit A stores blocks");
  assert.equal(stored[2].length, 5, "5 full blocks");
  assert.match(stored[2][0], /^[0-9a-f]{16}$/);
  assert.equal(typeof f.header.point.usage, "number");
  assert.equal(f.header.blocks.in_use, 6);
});

test("u64 hash column agrees with the 16-digit event hashes", () => {
  const i = small.frames.findIndex((f) => f.note === "admit A");
  const f = frame(i);
  const stored = new Set(f.header.events.filter((e) => e[1] === 0).flatMap((e) => e[2]));
  const c = f.columns;
  const seen = new Set();
  for (let k = 0; k < c.ids.length; k++) {
    if (c.hashed[k]) seen.add(hex64(c.hash64[2 * k], c.hash64[2 * k + 1]));
  }
  assert.deepEqual([...seen].sort(), [...stored].sort());
});

test("an empty tick is a delta with zero ids", () => {
  const i = small.frames.findIndex((f) => f.note === "empty tick");
  const f = frame(i);
  assert.equal(f.columns.ids.length, 0);
  assert.equal(f.seq, small.frames[i - 1].seq + 1);
});

test("unaligned Node Buffers are copied; typed views need alignment", () => {
  const raw = small.frames[1].bytes;
  const padded = Buffer.alloc(raw.length + 3);
  raw.copy(padded, 3);
  const f = decodeFrame(padded.subarray(3));
  assert.deepEqual(Array.from(f.columns.state), small.frames[1].expect.state);
});

test("bad frames are refused", () => {
  const ab = toArrayBuffer(small.frames[1].bytes);
  const bad = new Uint8Array(ab.slice(0));
  bad[0] = 0x58;
  assert.throws(() => decodeFrame(bad.buffer), ProtocolError);
  assert.throws(() => decodeFrame(ab.slice(0, ab.byteLength - 8)), ProtocolError);
  assert.throws(() => decodeFrame(new ArrayBuffer(10)), ProtocolError);
});

test("hex helpers", () => {
  assert.equal(hex64(0x89abcdef, 0x01234567), "0123456789abcdef");
  assert.deepEqual(parseHash64("0123456789abcdef"), [0x89abcdef, 0x01234567]);
  assert.deepEqual(parseHash64("ff"), [0xff, 0]);
  assert.equal(parseHash64("xyz"), null);
  const digest = "ab".repeat(24) + "0123456789abcdef";
  assert.deepEqual(parseHash64(digest), [0x89abcdef, 0x01234567]);
  assert.equal(eventHash64(digest), "0123456789abcdef");
});
