// The fleet page's rate chart: its axis ticks stay short and whole.

import { test } from "node:test";
import assert from "node:assert/strict";
import { clockText } from "../js/common/format.js";
import { MIN_SPAN, timeRange } from "../js/common/timeaxis.js";
import { tickText } from "../js/fleet/rate.js";

test("rate axis ticks: a few characters, never a cut ',000'", () => {
  assert.deepEqual([0, 5, 2.5, 950, 12000, 1500, 2500000, null].map(tickText), ["0", "5", "2.5", "950", "12k", "1.5k", "2.5M", ""]);
  for (const v of [1000, 12000, 250000, 9990000]) assert.ok(!tickText(v).includes(","), tickText(v));
});

test("the x range: a lone point gets MIN_SPAN seconds before it, never years", () => {
  assert.deepEqual(timeRange(1000, 1000), [1000 - MIN_SPAN, 1000]);
  assert.deepEqual(timeRange(990, 1000), [1000 - MIN_SPAN, 1000]);
  assert.deepEqual(timeRange(100, 1000), [100, 1000]);
  assert.deepEqual(timeRange(null, 1000), [1000 - MIN_SPAN, 1000]);
  const [lo, hi] = timeRange(null, null);
  assert.equal(hi - lo, MIN_SPAN);
  assert.match(clockText(1796160871), /^\d\d:\d\d:\d\d$/);
  assert.equal(clockText(null), "");
  assert.equal(clockText(undefined, "—"), "—"); // (a table's moment not known)
  assert.equal(clockText(NaN), "");
});
