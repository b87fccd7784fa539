// The fleet page's rate chart: its axis ticks stay short and whole.

import { test } from "node:test";
import assert from "node:assert/strict";
import { tickText } from "../js/fleet/rate.js";

test("rate axis ticks: a few characters, never a cut ',000'", () => {
  assert.deepEqual([0, 5, 2.5, 950, 12000, 1500, 2500000, null].map(tickText), ["0", "5", "2.5", "950", "12k", "1.5k", "2.5M", ""]);
  for (const v of [1000, 12000, 250000, 9990000]) assert.ok(!tickText(v).includes(","), tickText(v));
});
