// @ts-check
// A request's prompt blocks as a strip of bars: hit, or the reason it
// missed (colours from analysis.js), decode blocks dimmed; hover says why.
// Data: GET /api/requests/{id} (running: `blocks[i].reason` / `.miss`, block
// ids) or GET /api/misses/requests/{id} (also recently finished requests:
// `blocks[i].reason` / `.detail`).

import { rgbCss } from "../../common/palette.js";
import { REASON_LABEL, REASON_RGB } from "../state/missreasons.js";

/**
 * The extra keys a block was stored or asked with (null: none known).
 * @typedef {{lora_name?: string | null, cache_salt?: string | null} | null} ExtraKeys
 */

/**
 * Why a block missed, as the REST answers say it (the fields for its reason).
 * @typedef {object} MissDetail
 * @property {boolean} [expired] out of the eviction memory
 * @property {number | null} [evicted_ago_seconds]
 * @property {string} [cause]
 * @property {number | null} [block_id]
 * @property {string | null} [evicted_by]
 * @property {number | null} [queue_position_when_freed]
 * @property {number | null} [seconds_in_queue]
 * @property {boolean} [partial] the partial tail block
 * @property {number} [tokens]
 * @property {number | null} [shared_tokens]
 * @property {string | null} [with_request]
 * @property {ExtraKeys} [stored_with]
 * @property {ExtraKeys} [requested_with]
 * @property {boolean} [cached] a block the engine skipped (skipped): it was cached
 */

/**
 * One prompt or decode block of a request (GET /api/requests/{id} or
 * GET /api/misses/requests/{id}).
 * @typedef {object} RequestBlock
 * @property {number} [index]
 * @property {number[]} [block_ids] per group
 * @property {boolean} [hit]
 * @property {string | null} [reason]
 * @property {MissDetail | null} [miss] (running requests)
 * @property {MissDetail | null} [detail] (finished requests)
 * @property {number} [tokens]
 */

/**
 * What blockCells reads of a request.
 * @typedef {{blocks?: RequestBlock[], num_prompt_blocks?: number, num_prompt_tokens?: number, num_tokens?: number}} RequestBlocks
 */

/**
 * One bar: hit, miss (with its reason), pending or decode.
 * @typedef {object} Cell
 * @property {number} index
 * @property {"hit" | "miss" | "pending" | "decode"} kind
 * @property {string | null} reason
 * @property {MissDetail | null} detail
 * @property {number | null} blockId
 * @property {number | undefined} tokens
 */

/**
 * One cell per block: {index, kind: "hit" | "miss" | "pending" | "decode",
 * reason, detail, blockId, tokens}.  "pending": a prompt block whose reason
 * the analysis has not reported yet (the worker is a tick behind).
 * @param {RequestBlocks | null | undefined} req
 * @param {number | null | undefined} blockSize
 * @returns {Cell[]}
 */
export function blockCells(req, blockSize) {
  if (!req || !Array.isArray(req.blocks)) return [];
  const bs = blockSize || 16;
  const prompt =
    req.num_prompt_blocks !== undefined
      ? req.num_prompt_blocks
      : Math.ceil((req.num_prompt_tokens ?? req.num_tokens ?? 0) / bs);
  return req.blocks.map((b, i) => {
    const index = b.index ?? i;
    const blockId = Array.isArray(b.block_ids) ? b.block_ids[0] : null;
    /** @type {Cell["kind"]} */
    let kind;
    if (index >= prompt) kind = "decode";
    else if (b.hit) kind = "hit";
    else if (b.reason) kind = "miss";
    else kind = "pending";
    return { index, kind, reason: b.reason || null, detail: b.miss ?? b.detail ?? null, blockId, tokens: b.tokens };
  });
}

const secs = (/** @type {number | null | undefined} */ s) => (s === null || s === undefined ? "—" : s < 1 ? `${Math.round(s * 1000)} ms` : s < 120 ? `${s.toFixed(1)} s` : `${Math.round(s / 60)} min`);

/**
 * The hover line for one cell.
 * @param {Cell} c
 */
export function describeCell(c) {
  const where = `block ${c.index}${c.blockId !== null && c.blockId !== undefined ? ` · #${c.blockId}` : ""} · ${c.tokens ?? "?"} tok`;
  if (c.kind === "hit") return `${where} · prefix hit`;
  if (c.kind === "decode") return `${where} · decode (after the prompt)`;
  if (c.kind === "pending") return `${where} · missed, reason not reported yet`;
  /** @type {MissDetail} */
  const d = c.detail || {};
  let why = "";
  switch (c.reason) {
    case "evicted":
      why = d.expired
        ? "evicted long ago (out of the eviction memory)"
        : `evicted ${secs(d.evicted_ago_seconds)} ago (${d.cause || "?"}) from #${d.block_id ?? "?"}` +
          `${d.evicted_by ? ` taken by ${d.evicted_by}` : ""}` +
          `${d.queue_position_when_freed !== null && d.queue_position_when_freed !== undefined ? `, freed at queue position ${d.queue_position_when_freed}` : ""}` +
          `${d.seconds_in_queue !== null && d.seconds_in_queue !== undefined ? `, ${secs(d.seconds_in_queue)} in the queue` : ""}`;
      break;
    case "block_size_floor":
      why = d.partial ? `partial tail block (${d.tokens} tokens, never hashed)` : `shares ${d.shared_tokens ?? "?"} tokens of this block${d.with_request ? ` with ${d.with_request}` : ""}`;
      break;
    case "extra_keys": {
      const tag = (/** @type {ExtraKeys | undefined} */ t) => (t ? [t.lora_name && `lora ${t.lora_name}`, t.cache_salt && `salt ${t.cache_salt}`].filter(Boolean).join(", ") || "none" : "?");
      why = `same tokens stored with extra keys ${tag(d.stored_with)} (asked with ${tag(d.requested_with)})${d.with_request ? ` by ${d.with_request}` : ""}`;
      break;
    }
    case "chain_broken":
      why = "still cached, but an earlier block missed";
      break;
    case "reset":
      why = d.expired ? "dropped by a prefix-cache reset long ago" : `dropped by a prefix-cache reset ${secs(d.evicted_ago_seconds)} ago (not an eviction)`;
      break;
    case "last_token":
      why = "holds the last prompt token (always computed)";
      break;
    case "cold":
      why = "never seen";
      break;
    case "skipped":
      why = d.cached ? "the engine skipped the prefix cache (prompt_logprobs); it was cached" : "the engine skipped the prefix cache (prompt_logprobs)";
      break;
    default:
      why = c.reason || "";
  }
  return `${where} · ${REASON_LABEL[c.reason || ""] || c.reason}: ${why}`;
}


/**
 * The strip (a DOM element; one span per block).  `onhover(cell | null)`.
 * @param {Document} doc
 * @param {Cell[]} cells
 * @param {((cell: Cell | null) => void) | null} [onhover]
 */
export function renderBars(doc, cells, onhover) {
  const strip = doc.createElement("div");
  strip.className = "rq-bars";
  if (cells.length > 160) strip.classList.add("dense");
  else if (cells.length <= 40) strip.classList.add("wide");
  for (const c of cells) {
    const s = doc.createElement("span");
    const key = (c.kind === "miss" ? c.reason : c.kind) || "";
    s.className = `rq-bar k-${c.kind}`;
    s.dataset.index = String(c.index);
    s.dataset.kind = c.kind;
    if (c.reason) s.dataset.reason = c.reason;
    s.style.background = rgbCss(REASON_RGB[key] || REASON_RGB.pending);
    strip.append(s);
  }
  strip.addEventListener("mouseover", (ev) => {
    const c = cellAt(cells, ev);
    if (c && onhover) onhover(c);
  });
  strip.addEventListener("mouseleave", () => onhover && onhover(null));
  return strip;
}

/**
 * The cell of the bar an event happened on (null: off the bars).
 * @param {Cell[]} cells
 * @param {Event} ev
 */
export function cellAt(cells, ev) {
  const t = /** @type {HTMLElement | null} */ (ev.target);
  const i = t && t.dataset ? t.dataset.index : undefined;
  return i === undefined ? null : cells.find((x) => String(x.index) === i) || null;
}

/**
 * Counts per kind/reason for the strip's legend: [[key, n], ...] (most first).
 * @param {Cell[]} cells
 * @returns {[string, number][]}
 */
export function cellCounts(cells) {
  /** @type {Map<string, number>} */
  const m = new Map();
  for (const c of cells) {
    const k = (c.kind === "miss" ? c.reason : c.kind) || "";
    m.set(k, (m.get(k) || 0) + 1);
  }
  return [...m].sort((a, b) => b[1] - a[1]);
}
