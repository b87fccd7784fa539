// @ts-check
// What the words on the pages mean: the hover text of every stat tile,
// column and term (one place; docs/glossary.md says the same at more length,
// with vLLM's names).  Keyed by the text as shown, lower case.

export const TERMS = {
  // the stat tiles over the map
  "in use": { help: "blocks held by at least one running request (ref count ≥ 1): never evicted while held", vllm: "KVCacheBlock.ref_cnt > 0" },
  cached: { help: "free blocks (ref count 0) that still hold a prefix hash: a prompt with that prefix reuses them for free, until the free queue hands them out again", vllm: "free block with block_hash set" },
  empty: { help: "free blocks with no hash: handing them out loses nothing", vllm: "free block, block_hash None" },
  usage: { help: "share of the pool's blocks in use (free blocks do not count)", vllm: "vllm:kv_cache_usage_perc" },
  "prefix hit rate": { help: "prompt tokens found in the prefix cache / prompt tokens looked up, since the start (or the last reset)", vllm: "vllm:prefix_cache_hits / vllm:prefix_cache_queries" },
  "hash keys": { help: "distinct (block hash, group) keys in the prefix-cache hash map", vllm: "BlockHashToBlockMap" },
  requests: { help: "running requests: admitted and holding blocks, not finished", vllm: "vllm:num_requests_running" },
  "alloc/s": { help: "blocks handed out by the free queue per second (mean of the last second)" },
  "evict/s": { help: "cached blocks whose hash was dropped per second: the free queue handed them out for a new use", vllm: "BlockRemoved events" },
  // the map's legend
  "in use ×1": { help: "in use, held by one request (the shade gets lighter with the ref count: ×2, ×3, ×4+)" },
  "evicted soon": { help: "cached blocks the free queue will hand out within the LRU horizon at the current allocation rate" },
  null: { help: "block 0: the placeholder vLLM never hands out", vllm: "null_block" },
  // the stream health bar
  stream: { help: "the websocket that feeds this page: live, syncing (waiting for a snapshot), retrying or token needed" },
  seq: { help: "sequence number of the last frame (stream) or event (KV events): gaps in it are detected and resumed" },
  lag: { help: "how long a frame took from the server's tick to this page (stream); for the analysis: operations not yet analysed" },
  "frame lag": { help: "how long the latest frame took from the server's tick to this page (the stream). Not the engine's: on a mirror, the mirror item's 'applied' is the engine's step to the mirror's pool and 'page' the engine's step to this page" },
  drops: { help: "frames the server dropped for clients too slow to read them (all clients)" },
  resyncs: { help: "snapshots this page needed after the first of a connection / the server's total" },
  reconnects: { help: "times this page reconnected its websocket" },
  gaps: { help: "gaps in the frame seqs detected and resumed from the server's ring" },
  in: { help: "frames and bytes per second arriving on the websocket" },
  fps: { help: "frames this page drew per second (the map redraws only what changed)" },
  trace: { help: "a production trace (Mooncake JSON lines) replayed at its timestamps instead of the demo: its name, the share of its requests arrived, and the trace's own prefix hit rate (hit / prompt tokens)" },
  analysis: { help: "the analysis worker: 'lag N ops' = pool operations it has not analysed yet (a count of operations, not a time); its panels trail the live pool by that much" },
  // the LRU free queue
  "lru free queue": { help: "free blocks in the order they will be handed out: head (position 0) first; a block freed is put at the tail", vllm: "FreeKVCacheBlockQueue" },
  pos: { help: "position in the free queue: 0 = head, the next block handed out (a position, not a block id)" },
  block: { help: "#N: the block id (its index in the pool)", vllm: "KVCacheBlock.block_id" },
  stamp: { help: "when the block joined the free queue, as a counter: the queue is ordered by it (smallest = head)" },
  "evicted in": { help: "estimated time until the free queue hands this block out: queue position / allocation rate" },
  horizon: { help: "how far ahead the queue panel and the map's orange cells look: blocks handed out within this many seconds" },
  "first cached": { help: "queue position (pos N) of the first cached block, and the time until it is evicted" },
  "evicted within": { help: "cached blocks the free queue will hand out within the horizon: their prefixes will be lost" },
  // tables and the block detail
  state: { help: "in use, cached (free, with a hash) or empty (free, no hash)" },
  hash64: { help: "the block hash's first 64 bits in hex (the full hash is the digest)", vllm: "BlockHash" },
  hashes: { help: "the block hashes the event carries (+N: more in the same event)" },
  digest: { help: "the full block hash (sha256 or the configured hash function)", vllm: "BlockHash" },
  "ref count": { help: "how many running requests hold this block", vllm: "ref_cnt" },
  details: { help: "the block as the server reports it (GET /api/blocks/{id}): holders, queue position, sampled times" },
  "raw refs": { help: "references counted without deduplication (a request may hold a block twice)" },
  group: { help: "the KV-cache group the hash belongs to (one per attention type)", vllm: "kv_cache_group_id" },
  grp: { help: "the KV-cache group (one per attention type)", vllm: "kv_cache_group_id" },
  copies: { help: "blocks holding the same hash (a prompt computed again before the first copy was reused)" },
  blocks: { help: "block ids (#N), or a count of blocks" },
  "queue position": { help: "this block's place in the free queue (0 = head: handed out next)" },
  holders: { help: "the running requests holding this block" },
  lifetime: { help: "from allocation to eviction, for sampled blocks", vllm: "vllm:kv_block_lifetime_seconds" },
  "idle before eviction": { help: "time a block sat unused (ref count 0) before it was evicted", vllm: "vllm:kv_block_idle_before_evict_seconds" },
  "reuse gaps": { help: "time between successive reuses of a cached block", vllm: "vllm:kv_block_reuse_gap_seconds" },
  event: { help: "BlockStored (hashes cached), BlockRemoved (hashes evicted) or AllBlocksCleared (prefix cache reset)", vllm: "vllm.distributed.kv_events" },
  parent: { help: "the hash of the block before the first one in the event (the prefix it extends)", vllm: "parent_block_hash" },
  request: { help: "a request id: click it to see its blocks" },
  tokens: { help: "tokens: the prompt's plus those decoded so far" },
  hits: { help: "prompt blocks found in the prefix cache when the request was admitted" },
  // the panels' titles (each explains its own panel)
  "token usage": { help: "the token slots running requests' blocks reserve, the tokens they hold, and the empty slots at the end of each request's last block (tail waste)" },
  "allocations & evictions": { help: "blocks handed out by the free queue per second (alloc/s) and cached blocks whose hash was dropped to do it (evict/s)", vllm: "BlockRemoved events" },
  "why prompts missed": { help: "every prompt block that was not a prefix hit, by its reason (hover a reason for its meaning)" },
  "eviction regret": { help: "evicted hashes stored again later: work recomputed because the cache let them go" },
  "what if": { help: "shadow pools fed the same requests, with another size or free order: the hit rate each would have had" },
  "time travel": { help: "the pool at any recorded moment (scrub the timeline under the map), what changed between two moments, and the recording as a file" },
  "kv events": { help: "the KV-cache events vLLM would publish: blocks stored, removed, and the cache cleared", vllm: "vllm.distributed.kv_events" },
  // the hit-rate chart's legend
  "per tick (1s avg)": { help: "prompt tokens hit / looked up between two series points (about a second)" },
  cumulative: { help: "prompt tokens hit / looked up since the start, or since the last prefix-cache reset" },
  // the token chart
  "slots reserved": { help: "token slots of the blocks running requests hold (blocks × block size)" },
  held: { help: "tokens actually stored in those blocks" },
  "tail waste": { help: "slots reserved but empty: the unfilled end of each request's last block" },
  // the analysis: misses
  reason: { help: "why a prompt block was not a hit (hover a reason for its meaning)" },
  "blk/s": { help: "missed prompt blocks per second over the chart's window" },
  share: { help: "this reason's share of the missed prompt blocks" },
  "last token": { help: "the block with the prompt's last token is always computed, even when cached" },
  "block-size floor": { help: "a partial tail block (fewer tokens than the block size) is never cached, nor shared part-way" },
  cold: { help: "its hash was never seen before (within the bounded memory of evictions)" },
  evicted: { help: "its hash was cached before and evicted since (its block handed out again, or the evict operation): a bigger cache or another free order might have kept it" },
  reset: { help: "its hash was cached before and dropped by a prefix-cache reset since: not an eviction and not a regret (no cache size keeps a hash through a reset)", vllm: "reset_prefix_cache()" },
  "extra keys": { help: "the same tokens were stored under other extra keys (cache salt, LoRA)" },
  "chain broken": { help: "still cached, but an earlier block missed: the lookup stops at the first miss" },
  // regret
  "evictions/s": { help: "hashes evicted per second (the free queue handed their cached block out)" },
  "regrets/s": { help: "hashes stored again per second after their eviction" },
  regrets: { help: "hashes stored again after their eviction: each one is work recomputed" },
  "mean gap": { help: "mean time from the eviction to the hash being stored again" },
  "first tokens": { help: "the first tokens of the prefix these blocks belong to" },
  "owner → victim": { help: "owner: the request whose prefix was evicted; victim: the request that had to compute it again" },
  // what-if
  policy: { help: "the free order a shadow pool simulates: append_all (vLLM 0.16, LRU), s3fifo, uncached_first" },
  size: { help: "the shadow pool's capacity relative to the real pool (1× = the same number of blocks)" },
  "hit rate": { help: "prompt tokens hit / looked up, over the same requests, in that shadow pool" },
  "δ pt": { help: "hit-rate difference to the real pool, in percentage points" },
  evictions: { help: "blocks whose hash was dropped to make room" },
  "shadow pools": { help: "simulated pools fed the same requests, with another size or free order" },
  append_all: { help: "vLLM 0.16's free order (old name vllm016): freed blocks join the queue's tail, the head is evicted first (LRU)", vllm: "FreeKVCacheBlockQueue (0.16)" },
  uncached_first: { help: "vLLM >= 0.24's free order: freed blocks without a hash go to the queue's head (reused first), hashed ones to the tail", vllm: "FreeKVCacheBlockQueue (>= 0.24)" },
  s3fifo: { help: "S3-FIFO: a small probation queue in front of the main one; blocks seen once leave first" },
  // time travel
  "op seq": { help: "the number of pool operations (allocate, free, cache, reset …) since the start: time travel's exact position" },
  keyframes: { help: "full recorded states the time travel replays from (a moment = a keyframe + the operations after it)" },
  history: { help: "the map (and the panels that say so) show a recorded moment, not the live pool" },
  // prefix tree
  "prefix tree": { help: "cached hashes linked to their parents: prompts sharing a prefix share a branch" },
  branch: { help: "prompts diverge here: the number is how many different next blocks follow" },
  orphan: { help: "its parent hash was evicted: a lookup can no longer reach it" },
  subtree: { help: "cached blocks below this chain" },
};

/**
 * The hover text for a term as shown (case-insensitive), or "" when it is not one.
 * @param {unknown} text
 */
export function explain(text) {
  /** @type {Record<string, {help: string, vllm?: string}>} */
  const terms = TERMS;
  const t = terms[String(text).trim().toLowerCase()];
  if (!t) return "";
  return t.vllm ? `${t.help}\nvLLM: ${t.vllm}` : t.help;
}

/**
 * Give every <th> and [data-term] element under root a title from TERMS (unless it has one).
 * @param {ParentNode} root
 */
export function explainAll(root) {
  for (const el of root.querySelectorAll("th, [data-term]")) {
    if (!(el instanceof HTMLElement)) continue;
    if (el.title) continue;
    const help = explain(el.dataset.term || el.textContent);
    if (help) el.title = help;
  }
}
