import assert from "node:assert/strict";
import { test } from "node:test";

import { HashIndex } from "../js/dashboard/state/hashindex.js";
import { hex64 } from "../js/dashboard/wire/protocol.js";

// A small deterministic PRNG (mulberry32).
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

test("random adds and removes agree with a reference map (rehash, tombstones)", () => {
  const n = 3000;
  const r = rng(42);
  const idx = new HashIndex(n);
  const keyOf = new Map(); // id -> "lo/hi/g"
  const pool = [];
  for (let i = 0; i < 400; i++) pool.push([(r() * 2 ** 32) >>> 0, (r() * 2 ** 32) >>> 0, r() < 0.2 ? 1 : 0]);
  for (let step = 0; step < 40000; step++) {
    const id = Math.floor(r() * n);
    if (keyOf.has(id) && r() < 0.5) {
      idx.remove(id);
      keyOf.delete(id);
    } else {
      const [lo, hi, g] = pool[Math.floor(r() * pool.length)];
      idx.add(id, lo, hi, g);
      keyOf.set(id, `${lo}/${hi}/${g}`);
    }
  }
  const ref = new Map();
  for (const [id, k] of keyOf) {
    if (!ref.has(k)) ref.set(k, []);
    ref.get(k).push(id);
  }
  const got = new Map(idx.entries().map(([lo, hi, g, ids]) => [`${lo}/${hi}/${g}`, ids]));
  assert.equal(got.size, ref.size);
  for (const [k, ids] of ref) assert.deepEqual(got.get(k), ids.sort((a, b) => a - b), k);
  assert.equal(idx.size, ref.size);
  assert.equal(idx.blocks, keyOf.size);
  assert.equal(idx.multi, [...ref.values()].filter((v) => v.length > 1).length);
  for (const [id] of keyOf) assert.ok(idx.sameAs(id).includes(id));
  assert.equal(idx.multiSlots(1e9).length, idx.multi);
});

test("find, sameAs and numeric prefix search", () => {
  const idx = new HashIndex(10);
  idx.add(1, 0x89abcdef, 0x01234567, 0);
  idx.add(2, 0x89abcdef, 0x01234567, 0);
  idx.add(3, 0x89abcdef, 0x01234567, 1);
  idx.add(4, 0x00000001, 0xfedcba98, 0);
  assert.deepEqual(idx.sameAs(1), [1, 2]);
  assert.deepEqual(idx.sameAs(3), [3]);
  assert.equal(idx.find(0x89abcdef, 0x01234567, 2), -1);
  const hexes = (p) => idx.searchPrefix(p).map((s) => `${hex64(idx.kLo[s], idx.kHi[s])}/${idx.kGroup[s]}`).sort();
  assert.deepEqual(hexes("0"), ["0123456789abcdef/0", "0123456789abcdef/1"]);
  assert.deepEqual(hexes("01234567"), ["0123456789abcdef/0", "0123456789abcdef/1"]);
  assert.deepEqual(hexes("0123456789"), ["0123456789abcdef/0", "0123456789abcdef/1"]);
  assert.deepEqual(hexes("0123456789abcdef"), ["0123456789abcdef/0", "0123456789abcdef/1"]);
  assert.deepEqual(hexes("0123456789abcdee"), []);
  assert.deepEqual(hexes("FEDC"), ["fedcba9800000001/0"]);
  assert.deepEqual(hexes("xyz"), []);
  idx.remove(1);
  idx.remove(2);
  assert.equal(idx.find(0x89abcdef, 0x01234567, 0), -1);
  assert.equal(idx.size, 2);
  assert.equal(idx.tombs, 1);
  idx.add(5, 0x89abcdef, 0x01234567, 0);
  assert.deepEqual(idx.sameAs(5), [5]);
});
