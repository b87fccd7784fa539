// The lag from the engine's step to the page on a mirror service: the
// samples MirrorLag takes from the frames' `mirror` header, through the
// stream connection, on frames of the real encoder (the "mirror" scenario).

import assert from "node:assert/strict";
import { test } from "node:test";

import { MirrorLag } from "../js/dashboard/wire/mirrorlag.js";
import { PoolModel } from "../js/dashboard/state/model.js";
import { StreamConnection } from "../js/dashboard/wire/stream.js";
import { decodeFrame } from "../js/dashboard/wire/protocol.js";
import { loadScenario, toArrayBuffer } from "./fixtures.mjs";

const close = (a, b) => Math.abs(a - b) < 1e-6;

test("a delta bringing a new batch is one sample: receive time minus engine_ts", () => {
  const lag = new MirrorLag();
  assert.equal(lag.ingest({ engine_ts: 100, batch: 1 }, 100_500, false), null); // a snapshot: where samples start
  assert.equal(lag.samples.length, 0);
  assert.equal(lag.ingest({ engine_ts: 100, batch: 1 }, 101_000, true), null); // the same batch: the engine idle
  assert.ok(close(lag.ingest({ engine_ts: 100.25, batch: 2 }, 100_290, true), 40));
  assert.ok(close(lag.lastMs, 40));
  assert.equal(lag.ingest({ engine_ts: 100.25, batch: 2 }, 109_000, true), null);
  assert.equal(lag.samples.length, 1);
  assert.ok(close(lag.p50(), 40));
});

test("no header (no mirror, or no batch yet) and a non-finite engine_ts give nothing", () => {
  const lag = new MirrorLag();
  assert.equal(lag.ingest(undefined, 1000, true), null);
  assert.equal(lag.ingest(null, 1000, true), null);
  assert.equal(lag.ingest({ engine_ts: Number.NaN, batch: 3 }, 1000, true), null);
  assert.equal(lag.batch, null);
  assert.deepEqual(lag.samples, []);
  assert.equal(lag.lastMs, null);
  assert.equal(lag.p50(), null);
});

test("p50 is the median of the last `keep` samples", () => {
  const lag = new MirrorLag({ keep: 4 });
  const offsets = [30, 10, 20, 500, 40, 50];
  offsets.forEach((ms, i) => lag.ingest({ engine_ts: i, batch: i }, i * 1000 + ms, true));
  assert.equal(lag.taken, 6);
  assert.deepEqual(lag.samples.map(Math.round), [20, 500, 40, 50]); // the oldest two dropped
  assert.ok(close(lag.p50(), 45)); // even count: the mean of the middle two (40, 50)
  lag.ingest({ engine_ts: 6, batch: 6 }, 6000 + 5, true);
  assert.deepEqual(lag.samples.map(Math.round), [500, 40, 50, 5]);
  assert.ok(close(lag.p50(), 45));
  const odd = new MirrorLag();
  [7, 3, 9].forEach((ms, i) => odd.ingest({ engine_ts: i, batch: i }, i * 1000 + ms, true));
  assert.ok(close(odd.p50(), 7));
  assert.ok(close(odd.lastMs, 9));
});

test("the stream connection samples a mirror's frames as they arrive", (t) => {
  const sc = loadScenario("mirror");
  const conn = new StreamConnection(new PoolModel());
  const offsets = [40, 15, 25, 60, 70, 80, 90, 100]; // ms after each frame's engine_ts
  let clock = 0;
  t.mock.method(Date, "now", () => clock);
  const sampled = [];
  sc.frames.forEach((f, i) => {
    const mirror = decodeFrame(toArrayBuffer(f.bytes)).header.mirror;
    clock = mirror ? mirror.engine_ts * 1000 + offsets[i % offsets.length] : 5;
    const before = conn.mirrorLag.taken;
    conn._onMessage({ data: toArrayBuffer(f.bytes) });
    if (conn.mirrorLag.taken > before) sampled.push([f.note, Math.round(conn.mirrorLag.lastMs)]);
  });
  assert.equal(conn.model.seq, sc.frames[sc.frames.length - 1].seq);
  // the deltas bringing batches 7, 8 and 10; not the repeat of 7, not the snapshots
  assert.deepEqual(sampled, [
    ["batch 7", offsets[3]],
    ["batch 8", offsets[5]],
    ["batch 10", offsets[8 % offsets.length]],
  ]);
  assert.equal(conn.mirrorLag.batch, 10);
  assert.ok(close(conn.mirrorLag.p50(), offsets[3])); // the median of 60, 80 and 40
});

test("a service that is no mirror gives no sample", () => {
  const sc = loadScenario("small");
  const conn = new StreamConnection(new PoolModel());
  for (const f of sc.frames) conn._onMessage({ data: toArrayBuffer(f.bytes) });
  assert.equal(conn.model.seq, sc.frames[sc.frames.length - 1].seq);
  assert.equal(conn.mirrorLag.taken, 0);
  assert.equal(conn.mirrorLag.p50(), null);
});
