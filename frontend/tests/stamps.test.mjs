import assert from "node:assert/strict";
import { test } from "node:test";

import { PoolModel } from "../js/dashboard/state/model.js";
import { CACHED, EMPTY, IN_USE } from "../js/dashboard/wire/protocol.js";

// The "uncached_first" free order puts hashless blocks at the queue's head
// with stamps below every other one, negative ones included: the views that
// rebuild the queue from stamps must still give the queue's order.
test("negative stamps (head inserts) sort first in every queue view", () => {
  const m = new PoolModel();
  // block: 0 null, 1 cached @ 12, 2 empty @ -3, 3 cached @ -2, 4 in use, 5 empty @ 11, 6 cached @ -1
  m.state = new Uint8Array([0, CACHED, EMPTY, CACHED, IN_USE, EMPTY, CACHED]);
  m.stamp = new Float64Array([0, 12, -3, -2, 7, 11, -1]);
  const q = m.queueOrder();
  assert.deepEqual(q, [2, 3, 6, 5, 1]);
  for (const k of [0, 1, 3, 5, 9]) assert.deepEqual(m.queueHead(k), q.slice(0, k), `head(${k})`);
  assert.deepEqual(Array.from(m.queueProfile()), [0, 1, 1, 0, 1]);
  q.forEach((id, pos) => assert.equal(m.queuePosition(id), pos));
  assert.equal(m.queuePosition(4), null);
});
