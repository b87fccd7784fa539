import assert from "node:assert/strict";
import { test } from "node:test";

import { PoolModel } from "../js/dashboard/state/model.js";
import { decodeFrame, hex64 } from "../js/dashboard/wire/protocol.js";
import { loadScenario, toArrayBuffer } from "./fixtures.mjs";

const small = loadScenario("small");
const restart = loadScenario("restart");
const decode = (f) => decodeFrame(toArrayBuffer(f.bytes));

function indexMap(model) {
  return model.index
    .entries()
    .map(([lo, hi, g, ids]) => [hex64(lo, hi), g, ids])
    .sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : a[1] - b[1]));
}

function hashMapList(model) {
  return [...model.hashMap()]
    .map(([k, ids]) => {
      const [h, g] = k.split("/");
      return [h, Number(g), ids];
    })
    .sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : a[1] - b[1]));
}

function checkAgainst(model, exp, note) {
  assert.equal(model.seq, exp.seq, `${note}: seq`);
  assert.deepEqual(model.countStates(), exp.counts, `${note}: counts from columns`);
  assert.deepEqual(model.header.blocks, exp.header_blocks, `${note}: counts from the header`);
  assert.deepEqual(Array.from(model.state), exp.state, `${note}: state`);
  assert.deepEqual(Array.from(model.refCnt), exp.ref_cnt, `${note}: ref_cnt`);
  assert.deepEqual(Array.from(model.stamp), exp.stamp, `${note}: stamp`);
  assert.deepEqual(model.queueOrder(), exp.queue, `${note}: queue order from stamps`);
  assert.deepEqual(hashMapList(model), exp.hash_map, `${note}: hash map grouping`);
  assert.deepEqual(indexMap(model), exp.hash_map, `${note}: incremental hash index`);
  assert.equal(model.index.size, exp.hash_keys, `${note}: index keys`);
  assert.equal(model.index.multi, exp.multi_keys, `${note}: keys with several copies`);
  assert.equal(model.events.length, exp.num_events, `${note}: events kept`);
  assert.equal(model.points.length, exp.num_points, `${note}: series points`);
}

test("snapshot + every delta of a real session match the Python mirror", () => {
  const m = new PoolModel();
  for (const f of small.frames) {
    const r = m.apply(decode(f));
    assert.equal(r.status, f.kind === "delta" ? "applied" : f.kind, f.note);
    if (f.kind !== "config") checkAgainst(m, f.expect, f.note);
  }
  assert.equal(m.gaps, 0);
  assert.equal(m.epoch, small.epoch);
});

test("deltas before the first snapshot are ignored", () => {
  const m = new PoolModel();
  m.apply(decode(small.frames[0]));
  assert.equal(m.apply(decode(small.frames[2])).status, "ignored");
  assert.equal(m.seq, null);
  m.apply(decode(small.frames[1]));
  assert.equal(m.apply(decode(small.frames[2])).status, "applied");
});

test("a gap is detected; resuming from seq+1 (with overlap) catches up exactly", () => {
  const m = new PoolModel();
  const frames = small.frames.map(decode);
  m.apply(frames[0]);
  m.apply(frames[1]);
  m.apply(frames[2]);
  m.apply(frames[3]);
  // frames[4] is lost
  const r = m.apply(frames[5]);
  assert.equal(r.status, "gap");
  assert.equal(r.expected, frames[3].seq + 1);
  assert.equal(r.got, frames[5].seq);
  assert.equal(m.seq, frames[3].seq, "nothing applied across the gap");
  // the server replays from `expected`; an overlap is harmless
  assert.equal(m.apply(frames[3]).status, "ignored");
  for (let i = 4; i < frames.length; i++) assert.equal(m.apply(frames[i]).status, "applied");
  checkAgainst(m, small.frames.at(-1).expect, "after resume");
  assert.equal(m.gaps, 1);
});

test("a snapshot in the middle (resync) replaces the state", () => {
  const m = new PoolModel();
  const frames = small.frames.map(decode);
  for (let i = 0; i < 6; i++) m.apply(frames[i]);
  // a fresh snapshot (decoded anew: the model writes into the views it keeps)
  const snap = decode(small.frames[1]);
  assert.equal(m.apply(snap).status, "snapshot");
  checkAgainst(m, small.frames[1].expect, "resynced to the snapshot");
  assert.equal(m.snapshots, 2);
});

test("a config with another epoch (server restart) drops the state until its snapshot", () => {
  const m = new PoolModel();
  for (const f of small.frames) m.apply(decode(f));
  const [cfg, snap, delta] = restart.frames.map(decode);
  assert.notEqual(cfg.header.epoch, m.epoch);
  m.apply(cfg);
  assert.equal(m.seq, null, "state forgotten");
  assert.equal(m.epoch, restart.epoch);
  assert.equal(m.apply(delta).status, "ignored", "no snapshot yet");
  m.apply(snap);
  assert.equal(m.n, 32, "resized to the new pool");
  checkAgainst(m, restart.frames[1].expect, "new server snapshot");
  m.apply(delta);
  checkAgainst(m, restart.frames[2].expect, "new server delta");
});

test("the same epoch keeps the state (reconnect + resume)", () => {
  const m = new PoolModel();
  for (const f of small.frames.slice(0, 5)) m.apply(decode(f));
  const seq = m.seq;
  m.apply(decode(small.frames[0]));
  assert.equal(m.seq, seq);
  assert.equal(m.nextSeq, seq + 1);
});

test("queue head, profile and positions agree with the full order", () => {
  const m = new PoolModel();
  for (const f of small.frames) {
    m.apply(decode(f));
    if (f.kind === "config") continue;
    const q = m.queueOrder();
    for (const k of [0, 1, 5, 17, 200]) assert.deepEqual(m.queueHead(k), q.slice(0, k), `${f.note} head(${k})`);
    const prof = m.queueProfile();
    assert.deepEqual(Array.from(prof), q.map((id) => (m.state[id] === 2 ? 1 : 0)), f.note);
    q.forEach((id, pos) => assert.equal(m.queuePosition(id), pos));
    assert.equal(m.queuePosition(0), null, "the null block is never free");
  }
});

test("dirty ids are handed to the renderer once, then cleared", () => {
  const m = new PoolModel();
  const frames = small.frames.map(decode);
  m.apply(frames[0]);
  m.apply(frames[1]);
  let got;
  m.drainDirty((full, ids, n) => (got = { full, n }));
  assert.deepEqual(got, { full: true, n: 0 });
  m.apply(frames[2]);
  m.apply(frames[3]);
  m.drainDirty((full, ids, n) => (got = { full, ids: Array.from(ids.subarray(0, n)).sort((a, b) => a - b) }));
  const expected = new Set([...frames[2].columns.ids, ...frames[3].columns.ids]);
  assert.equal(got.full, false);
  assert.deepEqual(got.ids, [...expected].sort((a, b) => a - b), "each id once");
  m.drainDirty((full, ids, n) => (got = n));
  assert.equal(got, 0);
});

test("histograms survive deltas that carry none", () => {
  const m = new PoolModel();
  for (const f of small.frames) m.apply(decode(f));
  assert.ok(m.histograms);
  assert.deepEqual(Object.keys(m.histograms).sort(), ["idle", "lifetime", "reuse_gap"]);
  assert.equal(m.histograms.lifetime.counts.length, m.histograms.lifetime.buckets.length + 1);
});
