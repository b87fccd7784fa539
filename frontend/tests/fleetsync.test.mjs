// The fleet page's copy of an instance's map (fleet/instancemap.js) and its
// sync model (fleet/sync.js): one snapshot, then events in seq order; REST
// read again only on a gap, a log ahead of the copy, or a map that started over.

import { test } from "node:test";
import assert from "node:assert/strict";
import { InstanceMap } from "../js/fleet/instancemap.js";
import { InstanceSync } from "../js/fleet/sync.js";

const A = "00000000000000a1";
const B = "00000000000000b2";
const C = "00000000000000c3";
const D = "00000000000000d4";

/** A snapshot holding A (root) and B (A's child), as GET /api/fleet/x/snapshot answers. */
function snapshot(logSeq, resets = 0, items = null) {
  const entry = (hash, parent, seq) => ({
    hash, hash_int: BigInt(`0x${hash}`).toString(), parent, copies: 1, media: { "-": 1 }, groups: { "-": 1 },
    block_size: 2, num_tokens: 2, tokens: [1, 2], lora_id: null, lora_name: null, stored_seq: seq,
  });
  items ??= [entry(A, null, 1), entry(B, A, 1)];
  return { instance: "x", exact: true, event_log_seq: logSeq, state_resets: resets, max_keys: null,
    total_keys: items.length, blocks: items.length, truncated: false, items };
}

const stored = (seq, hashes, parent, extra = {}) => ({
  instance: "x", seq, batch_seq: 100 + seq, ts: seq, type: "BlockStored", block_hashes: hashes,
  parent_block_hash: parent, token_ids: [5, 6, 7, 8], num_tokens: 4, block_size: 2, medium: null, ...extra,
});
const removed = (seq, hashes, extra = {}) => ({ instance: "x", seq, batch_seq: 100 + seq, ts: seq, type: "BlockRemoved", block_hashes: hashes, medium: null, ...extra });
const health = (logSeq, resets = 0) => [{ name: "x", event_log_seq: logSeq, state_resets: resets }];

test("the map: stored adds copies, removed takes them, the order is first stored", () => {
  const m = new InstanceMap();
  m.load(snapshot(2));
  assert.equal(m.apply(stored(2, [C], B)), "old", "in the snapshot already");
  assert.equal(m.apply(stored(3, [C, D], B)), "applied");
  assert.deepEqual([...m.entries.keys()], [A, B, C, D]);
  assert.equal(m.entries.get(D).parent, C);
  assert.deepEqual(m.entries.get(D).tokens, [7, 8]);
  assert.equal(m.entries.get(C).stored_seq, 103);
  assert.equal(m.entries.get(C).hash_int, String(0xc3));
  assert.equal(m.apply(stored(4, [C], B, { medium: "cpu" })), "applied");
  assert.equal(m.copies(C), 2);
  assert.deepEqual(m.entries.get(C).media, { "-": 1, cpu: 1 });
  assert.equal(m.multi, 1);
  assert.equal(m.apply(removed(5, [C], { medium: "cpu" })), "applied");
  assert.deepEqual(m.entries.get(C).media, { "-": 1 });
  assert.equal(m.apply(removed(6, [A, D, D])), "applied", "a removal of a hash not held changes nothing");
  assert.deepEqual([...m.entries.keys()], [B, C]);
  assert.equal(m.blocks, 2);
  assert.equal(m.multi, 0);
  assert.deepEqual([...m.depths()], [[B, 1], [C, 2]], "B's parent left: B is a root now");
  assert.equal(m.apply(stored(8, [A], null)), "gap", "event 7 is missing");
  assert.equal(m.logSeq, 6);
  assert.equal(m.apply({ instance: "x", seq: 7, batch_seq: 9, ts: 7, type: "AllBlocksCleared" }), "applied");
  assert.equal(m.entries.size, 0);
  assert.equal(m.blocks, 0);
});

/** An InstanceSync whose reads the test answers: `reads` holds them, each with its resolve. */
function harness() {
  const reads = [];
  let changes = 0;
  const errors = [];
  const sync = new InstanceSync({
    read: (name) => new Promise((resolve) => reads.push({ name, resolve })),
    onChange: () => (changes += 1),
    onError: (err) => errors.push(err),
  });
  return { sync, reads, errors, changes: () => changes };
}

const settle = () => new Promise((r) => setTimeout(r, 0));

test("sync: one read, then events alone; events during the read wait for it", async () => {
  const { sync, reads, errors } = harness();
  sync.select("x");
  assert.equal(reads.length, 1);
  // events come while the snapshot is read: 2 is in it, 3 is not
  sync.tick([stored(2, [C], B), stored(3, [D], C), { ...stored(1, [A], null), instance: "y" }], health(3));
  const withC = snapshot(2).items.concat([{ ...snapshot(2).items[1], hash: C, parent: B }]);
  reads[0].resolve(snapshot(2, 0, withC));
  await settle();
  assert.deepEqual([...sync.map.entries.keys()], [A, B, C, D]);
  assert.equal(sync.map.logSeq, 3);
  // then the stream alone: no read however many events
  for (let s = 4; s < 40; s += 2) {
    sync.tick([removed(s, [D]), stored(s + 1, [D], C)], health(s + 1));
  }
  assert.equal(reads.length, 1, "no REST read while the events follow on");
  assert.equal(sync.map.logSeq, 39);
  const forest = sync.tree.build((h) => sync.map.copies(h));
  assert.equal(forest.live, 4);
  assert.deepEqual(forest.roots.map((r) => r.hash), [A]);
  assert.equal(forest.roots[0].size, 4, "one chain A-B-C-D, from the snapshot and the events");
  assert.deepEqual(errors, []);
});

test("sync: a missing event, a log ahead, a map started over each read again", async () => {
  const { sync, reads } = harness();
  sync.select("x");
  reads[0].resolve(snapshot(5));
  await settle();
  // event 6 never came
  sync.tick([stored(7, [C], B)], health(7));
  assert.equal(reads.length, 2);
  assert.match(sync.lastReason, /events 6–6 missing/);
  sync.tick([stored(8, [D], C)], health(8)); // waits for the read
  assert.equal(reads.length, 2, "one read at a time");
  reads[1].resolve(snapshot(7, 0, snapshot(7).items.concat([{ ...snapshot(7).items[1], hash: C, parent: B }])));
  await settle();
  assert.equal(sync.map.logSeq, 8);
  assert.deepEqual([...sync.map.entries.keys()], [A, B, C, D]);
  // a tick with nothing for us but the log is ahead (events lost before a reconnect)
  sync.tick([], health(10));
  assert.equal(reads.length, 3);
  assert.equal(sync.lastReason, "behind the log");
  reads[2].resolve(snapshot(10));
  await settle();
  sync.tick([], health(10));
  assert.equal(reads.length, 3, "caught up: nothing to read");
  // the observer's map started over without an event (an unreplayable gap)
  sync.tick([], health(10, 1));
  assert.equal(reads.length, 4);
  assert.equal(sync.lastReason, "the map started over");
  reads[3].resolve(snapshot(10, 1, []));
  await settle();
  assert.equal(sync.map.entries.size, 0);
  sync.tick([], health(10, 1));
  assert.equal(reads.length, 4);
});

test("sync: another instance drops a read still out for the last one", async () => {
  const { sync, reads } = harness();
  sync.select("x");
  sync.select("y");
  assert.deepEqual(reads.map((r) => r.name), ["x", "y"]);
  reads[1].resolve({ ...snapshot(4, 0, []), instance: "y" });
  await settle();
  reads[0].resolve(snapshot(2)); // late: for x
  await settle();
  assert.equal(sync.map.entries.size, 0);
  assert.equal(sync.map.logSeq, 4);
});
