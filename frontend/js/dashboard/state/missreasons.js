// @ts-check
// Why a prompt's blocks missed, as the page names and colours them (the miss
// chart, its table, the request bars, a block's detail): the reasons the
// server classifies (docs/protocol.md), in the chart's order.

export const REASONS = ["last_token", "block_size_floor", "cold", "evicted", "extra_keys", "chain_broken", "reset", "skipped"];

/** @type {Record<string, string>} */
export const REASON_LABEL = {
  last_token: "last token",
  block_size_floor: "block-size floor",
  cold: "cold",
  evicted: "evicted",
  extra_keys: "extra keys",
  chain_broken: "chain broken",
  reset: "reset",
  skipped: "skipped by the engine",
};

/** @type {Record<string, string>} */
export const REASON_HELP = {
  last_token: "holds the last prompt token: always computed, even when cached",
  block_size_floor: "partial tail block, or the prompt shares only part of this block with an earlier one",
  cold: "its hash was never seen (within the bounded memory of evictions)",
  evicted: "its hash was cached before and evicted since (its block reused, or the evict operation)",
  extra_keys: "the same first-block tokens were stored under other extra keys (cache salt, LoRA)",
  chain_broken: "still cached, but an earlier block missed and the lookup stops at the first miss",
  reset: "its hash was cached before and dropped by a prefix-cache reset since: not an eviction, no regret",
  skipped: "a mirrored engine did not look the prompt up (a prompt_logprobs request skips the prefix cache)",
};

/**
 * [r, g, b] per reason (+ hit, decode, pending): the chart, the table, the request bars.
 * @type {Record<string, import("../../common/palette.js").RGB>}
 */
export const REASON_RGB = {
  hit: [46, 160, 67],
  last_token: [210, 168, 255],
  block_size_floor: [227, 179, 65],
  cold: [110, 118, 129],
  evicted: [248, 81, 73],
  extra_keys: [219, 97, 162],
  chain_broken: [240, 136, 62],
  reset: [57, 197, 187],
  skipped: [121, 192, 255],
  decode: [48, 54, 61],
  pending: [72, 79, 88],
};

/** @type {Record<string, import("../../common/palette.js").RGB>} */
