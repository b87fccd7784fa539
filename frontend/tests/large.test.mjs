import assert from "node:assert/strict";
import { test } from "node:test";

import { PoolModel } from "../js/dashboard/state/model.js";
import { decodeFrame, hex64 } from "../js/dashboard/wire/protocol.js";
import { loadScenario, toArrayBuffer } from "./fixtures.mjs";

const large = loadScenario("large");

test("100k blocks: snapshot + ~1,000-block deltas decode and apply cheaply and exactly", () => {
  const buffers = large.frames.map((f) => toArrayBuffer(f.bytes));
  const m = new PoolModel();
  const t0 = performance.now();
  for (const buf of buffers) m.apply(decodeFrame(buf));
  const ms = performance.now() - t0;
  const exp = large.frames.at(-1).expect;
  assert.equal(m.n, 100000);
  assert.equal(m.seq, exp.seq);
  assert.deepEqual(m.countStates(), exp.counts);
  assert.equal(m.index.size, exp.hash_keys);
  assert.equal(m.index.multi, exp.multi_keys);
  assert.deepEqual(m.queueHead(200), exp.queue_head);
  assert.equal(m.queueProfile().length, exp.queue_len);
  for (const [h, g, ids] of exp.multi_sample) {
    const slot = m.index.searchPrefix(h).find((s) => m.index.kGroup[s] === g);
    assert.deepEqual(m.index.idsOf(slot), ids, h);
  }
  // generous bound for a loaded 2-core machine: the work is ~10 ms
  assert.ok(ms < 1500, `decode + apply took ${ms.toFixed(1)} ms`);
  const deltas = large.frames.filter((f) => f.kind === "delta");
  assert.ok(deltas.every((f) => f.ids >= 500), "each delta changes hundreds of blocks");
  // the index agrees with the columns for every hashed block
  for (let id = 0; id < m.n; id += 97) {
    if (!m.hashed[id]) continue;
    const slot = m.index.slotOf[id];
    assert.equal(hex64(m.index.kLo[slot], m.index.kHi[slot]), hex64(m.hash64[2 * id], m.hash64[2 * id + 1]));
  }
});

test("queue head at 100k without a full sort is fast", () => {
  const m = new PoolModel();
  for (const f of large.frames) m.apply(decodeFrame(toArrayBuffer(f.bytes)));
  const t0 = performance.now();
  for (let i = 0; i < 10; i++) m.queueHead(500);
  const per = (performance.now() - t0) / 10;
  assert.ok(per < 100, `queueHead(500) took ${per.toFixed(1)} ms`);
  assert.deepEqual(m.queueHead(500).slice(0, 200), large.frames.at(-1).expect.queue_head);
});
