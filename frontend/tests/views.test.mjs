// Prefix tree from real BlockStored events, the LRU rate, event filters,
// token parsing: the pieces of the panels that hold logic.
import assert from "node:assert/strict";
import { test } from "node:test";

import { parseTokens } from "../js/dashboard/panels/controls.js";
import { eventMatches } from "../js/dashboard/panels/events.js";
import { allocRate } from "../js/dashboard/panels/lru.js";
import { PoolModel } from "../js/dashboard/state/model.js";
import { PrefixTree, chainFrom, copiesFromIndex } from "../js/dashboard/state/prefixtree.js";
import { decodeFrame, hex64 } from "../js/dashboard/wire/protocol.js";
import { loadScenario, toArrayBuffer } from "./fixtures.mjs";

const small = loadScenario("small");

function replay(until) {
  const model = new PoolModel();
  const tree = new PrefixTree();
  for (const f of small.frames) {
    const frame = decodeFrame(toArrayBuffer(f.bytes));
    model.apply(frame);
    if (frame.kind === 2) tree.applyEvents(frame.header.recent_events || []);
    if (frame.kind === 3) tree.applyEvents(frame.header.events || []);
    if (f.note === until) break;
  }
  return { model, tree, forest: tree.build(copiesFromIndex(model.index, 1)) };
}

test("prefix tree: shared prefix, a branch per request, a duplicate copy", () => {
  const { model, forest } = replay("admit C (duplicate)");
  // A: 5 full blocks; B shares A's first 3 then has 3 of its own; C = A's 5
  assert.equal(forest.live, 8);
  assert.equal(forest.roots.length, 1);
  const root = forest.roots[0];
  assert.equal(root.size, 8);
  const chain = chainFrom(root);
  assert.equal(chain.length, 3, "the shared prefix collapses to one chain");
  const fork = chain.at(-1);
  assert.equal(fork.children.length, 2, "then A and B diverge");
  const sizes = fork.children.map((c) => chainFrom(c).length).sort();
  assert.deepEqual(sizes, [2, 3]);
  // C recomputed A's last block: that hash has two physical copies
  const aTail = fork.children.find((c) => chainFrom(c).length === 2);
  assert.equal(chainFrom(aTail).at(-1).copies, 2);
  assert.equal(model.index.multi, 1);
  // every live node is a hashed block of the model
  for (const hx of forest.nodes.keys()) {
    const found = model.index.searchPrefix(hx, 2);
    assert.equal(found.length, 1);
    assert.equal(hex64(model.index.kLo[found[0]], model.index.kHi[found[0]]), hx);
  }
});

test("prefix tree: evicted hashes drop out, orphans become roots, a reset clears it", () => {
  const evicted = replay("allocate 58 (evicts cached blocks)");
  assert.equal(evicted.forest.live, evicted.model.index.size);
  assert.ok(evicted.forest.live < 9);
  for (const r of evicted.forest.roots) {
    if (r.parent !== null) assert.ok(r.orphan, "a root with a parent lost that parent");
  }
  const reset = replay("reset");
  assert.equal(reset.forest.live, 0);
  assert.equal(reset.tree.parents.size, 0);
  const after = replay("admit E");
  assert.equal(after.forest.live, after.model.index.size);
  assert.equal(after.forest.roots.length, 1);
});

test("prefix tree: loading REST nodes and replaying events is idempotent", () => {
  const { model, tree } = replay("finish B and C");
  const nodes = [...tree.parents].map(([hash, parent]) => ({ hash, parent, block_ids: [] }));
  const copy = new PrefixTree();
  copy.load(nodes);
  copy.load(nodes);
  for (const f of small.frames.slice(0, 5)) {
    const fr = decodeFrame(toArrayBuffer(f.bytes));
    if (fr.kind === 3) copy.applyEvents(fr.header.events);
  }
  const a = tree.build(copiesFromIndex(model.index, 1));
  const b = copy.build(copiesFromIndex(model.index, 1));
  assert.deepEqual([...b.nodes.keys()].sort(), [...a.nodes.keys()].sort());
  assert.equal(tree.rootOf(chainFrom(a.roots[0]).at(-1).hash), a.roots[0].hash);
});

test("allocation rate: mean of the last seconds of points", () => {
  const pts = [];
  for (let i = 0; i < 100; i++) pts.push({ ts: i * 0.05, alloc_per_s: i < 60 ? 1000 : 200 });
  assert.equal(allocRate(pts, 1.0), 200);
  assert.equal(allocRate([], 3), 0);
  assert.equal(allocRate([{ ts: 1, alloc_per_s: null }], 3), 0);
});

test("event filters by type and hash (64-bit form or digest)", () => {
  const stored = [7, 0, ["00000000000000aa", "1234567890abcdef"], "ffffffffffffffff", 32, 16, null];
  const removed = [8, 1, ["1234567890abcdef"]];
  const cleared = [9, 2];
  const all = new Set([0, 1, 2]);
  assert.ok(eventMatches(stored, all, ""));
  assert.ok(eventMatches(stored, all, "1234"));
  assert.ok(eventMatches(stored, all, "ffff"), "the parent counts");
  assert.ok(!eventMatches(stored, new Set([1]), ""));
  assert.ok(eventMatches(removed, all, "12345678"));
  assert.ok(!eventMatches(cleared, all, "12"));
  const digest = [10, 1, ["ab".repeat(24) + "1234567890abcdef"]];
  assert.ok(eventMatches(digest, all, "1234567890"));
});

test("token ids for a hand-made request", () => {
  assert.deepEqual(parseTokens("1 2, 3"), [1, 2, 3]);
  assert.deepEqual(parseTokens("0..4"), [0, 1, 2, 3, 4]);
  assert.equal(parseTokens("rand 10").length, 10);
  assert.deepEqual(parseTokens("5 0..1").slice(0, 3), [5, 0, 1]);
  assert.throws(() => parseTokens("abc"));
  assert.throws(() => parseTokens("5..1"));
});
