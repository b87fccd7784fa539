// The request view's words for a story's operations (requestview.js), on
// the shapes GET /api/requests/{id}/story returns.
import assert from "node:assert/strict";
import { test } from "node:test";

import { stepText } from "../js/dashboard/panels/requestview.js";

test("each operation of a story in words", () => {
  assert.equal(
    stepText({ op: "admit", ok: true, tokens: 18, num_hit_blocks: 4, num_new_blocks: 1, block_ids: [[1, 2, 3, 4, 7]] }),
    "18 tokens, 4 blocks hit, 1 new: 1 2 3 4 7",
  );
  assert.equal(stepText({ op: "append", ok: true, tokens: 3, num_tokens: 21, new_block_ids: [[6]] }), "+3 tokens → 21, new block 6");
  assert.equal(stepText({ op: "append", ok: true, tokens: 1, num_tokens: 22, new_block_ids: [[]] }), "+1 tokens → 22");
  assert.equal(stepText({ op: "finish", ok: true, freed_block_ids: [[6, 5, 4]] }), "freed 6 5 4");
  assert.equal(
    stepText({ op: "admit", ok: false, error: { code: "not_enough_blocks", message: "admit needs 59" } }),
    "refused: not_enough_blocks (admit needs 59)",
  );
  assert.equal(stepText({ op: "admit", ok: true, tokens: 8, num_hit_blocks: 0, num_new_blocks: 2, block_ids: [[1, 2], [3, 4]] }), "8 tokens, 0 blocks hit, 2 new: 1 2 | 3 4");
});

test("a mirrored engine's record says it in words", () => {
  assert.equal(stepText({ op: "preempt", ok: true, text: "preempted: its blocks freed, it waits again" }), "preempted: its blocks freed, it waits again");
});
