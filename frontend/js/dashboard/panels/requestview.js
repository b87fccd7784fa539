// @ts-check
// One request's story (GET /api/requests/{id}/story): search a request id,
// or follow a link from the block detail, the running list, the regret
// table or the event log; see its blocks (hit, or why each missed), and when
// it was first tried, admitted, decoded and finished.  The panel builds its
// own DOM (placed after the time-travel panel) so the page needs no markup.

import { api } from "../../common/api.js";
import { h, setText } from "../../common/dom.js";
import { clockText, dur, int } from "../../common/format.js";
import { REASON_LABEL } from "../state/missreasons.js";
import { unknownEl } from "./unknown.js";

/** Why a mirrored engine's request has no decode times. */
const NO_DECODE = "the engine's plugin tells a request's arrival, first scheduling, preemptions and finish, not its decode steps (nor the blocks they add)";
import { blockCells, cellAt, cellCounts, describeCell, renderBars } from "../render/reqbars.js";

/**
 * One step of a request's timeline (an operation of the recording, or a
 * mirrored engine's record in words).
 * @typedef {object} StoryStep
 * @property {number} [seq]
 * @property {number} [ts]
 * @property {string} op admit | append | finish | ...
 * @property {boolean} ok
 * @property {string} [text]
 * @property {{code?: string, message?: string} | null} [error]
 * @property {number} [tokens]
 * @property {number} [num_tokens]
 * @property {number} [num_hit_blocks]
 * @property {number} [num_new_blocks]
 * @property {number[][]} [block_ids] per group
 * @property {number[][]} [new_block_ids] per group
 * @property {number[][]} [freed_block_ids] per group
 */

/**
 * GET /api/requests/{id}/story: the fields the panel reads.
 * @typedef {object} RequestStory
 * @property {string} request_id
 * @property {string} state
 * @property {Record<string, number | null | undefined>} [times] first_attempt_at, admitted_at, first_decode_at, last_decode_at, finished_at
 * @property {Record<string, number>} [misses] prompt blocks missed, by reason
 * @property {number} [num_prompt_tokens]
 * @property {number} [num_tokens]
 * @property {number} [num_hit_blocks]
 * @property {number} [hit_tokens]
 * @property {number} [admissions_refused]
 * @property {number} [preemptions]
 * @property {{steps: number, tokens: number, new_blocks: number} | null} [decode]
 * @property {(import("../render/reqbars.js").RequestBlock & {kind?: string, added_at?: number | null})[]} [blocks]
 * @property {StoryStep[]} [timeline]
 * @property {number} [timeline_omitted]
 * @property {{running?: boolean, miss_reasons?: boolean, engine?: boolean, recording?: {operations_found?: number, first_seq?: number, last_seq?: number} | null}} [sources]
 * @property {number} [earlier_lives]
 * @property {{finished_requests_kept: number, recording_max_ops: number}} limits
 * @property {string | null} [client_id] on a mirror, looked up by the client's id: that id
 * @property {string[]} [engine_ids] on a mirror: vLLM's requests made of that client id (n > 1: several)
 */

const after = (/** @type {number | null | undefined} */ ts, /** @type {number | null | undefined} */ t0) => (ts === null || ts === undefined || t0 === null || t0 === undefined ? "" : ` (+${dur(Math.max(0, ts - t0))})`);
const ids = (/** @type {number[][] | undefined} */ tables) => (tables || []).map((t) => t.join(" ")).join(" | ");

/**
 * What one timeline step did, in words.
 * @param {StoryStep} s
 */
export function stepText(s) {
  if (s.text) return s.text; // a mirrored engine's record says it in words
  if (!s.ok) return `refused: ${(s.error && s.error.code) || "error"}${s.error && s.error.message ? ` (${s.error.message})` : ""}`;
  if (s.op === "admit") return `${int(s.tokens)} tokens, ${int(s.num_hit_blocks)} blocks hit, ${int(s.num_new_blocks)} new: ${ids(s.block_ids)}`;
  if (s.op === "append") return `+${int(s.tokens)} tokens → ${int(s.num_tokens)}${s.new_block_ids && s.new_block_ids[0].length ? `, new block ${ids(s.new_block_ids)}` : ""}`;
  if (s.op === "finish") return `freed ${ids(s.freed_block_ids)}`;
  return "";
}

export class RequestView {
  /**
   * `opts.onBlock(id)`: show a block in the detail panel; `opts.blockSize()`;
   * `opts.holdersOf(hashHex)`: promise of the request ids holding a hash.
   * @param {{onBlock?: (id: number) => void, blockSize?: () => number | null | undefined, holdersOf?: (hex: string) => Promise<string[]>}} [opts]
   */
  constructor(opts = {}) {
    this.opts = opts;
    this.rid = null;
    this.story = null;
    /** @type {{client: string, ids: string[]} | null} the client's id and vLLM's requests made of it (a mirror) */
    this.family = null;
    this.seq = 0;
    this.input = h("input", { id: "rv-id", class: "search", placeholder: "request id", spellcheck: "false", "aria-label": "request id", title: "a request id: its blocks, hits, misses and times (on a mirror: vLLM's id, or the id the client got back, cmpl-…)" });
    this.status = h("span", { id: "rv-status", class: "muted" }, "");
    this.body = h("div", { id: "rv-body", class: "rv-body", style: "padding: 0 10px 8px" }, h("p", { class: "muted" }, "Search a request id, or click one in the block detail, the running list, the regret table or the event log."));
    const form = h("form", { id: "rv-form", class: "diff-form", style: "padding: 6px 10px" }, this.input, h("button", { type: "submit" }, "Show"));
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const rid = this.input.value.trim();
      if (rid) this.show(rid);
    });
    this.el = h(
      "section",
      // not an "an-panel": a story needs no analysis (the running request, the recording)
      { class: "panel rv-panel", id: "request-view" },
      h("div", { class: "panel-head" }, h("h2", null, "Request"), h("span", { class: "muted" }, "its blocks, hits, misses and times"), h("span", { class: "spacer" }), this.status),
      form,
      this.body,
    );
    this.el.style.gridColumn = "1 / -1"; // the whole analysis row
    this.el.style.height = "auto"; // as tall as its story; its two tables scroll inside
    this.el.style.overflow = "hidden";
  }

  /**
   * Put the panel on the page: after `anchor` (an element), or at the end of `parent`.
   * @param {Element | null} anchor
   * @param {Element} [parent]
   */
  mount(anchor, parent) {
    if (anchor) anchor.after(this.el);
    else (parent || document.body).append(this.el);
    return this;
  }

  /**
   * Show one request's story (and scroll the panel into view).
   * @param {string} rid
   * @param {{scroll?: boolean}} [opts]
   */
  async show(rid, { scroll = true } = {}) {
    this.rid = rid;
    this.input.value = rid;
    const seq = ++this.seq;
    setText(this.status, "loading…");
    this.el.dataset.state = "loading";
    // another request: the previous story goes at once (never shown under the new id)
    if (!this.story || this.story.request_id !== rid) {
      this.story = null;
      this.body.replaceChildren(h("p", { class: "muted", id: "rv-loading" }, `loading ${rid}…`));
    }
    if (scroll) this.el.scrollIntoView({ block: "nearest" });
    try {
      const s = await api("GET", `/api/requests/${encodeURIComponent(rid)}/story`, undefined, { quiet: true });
      if (seq !== this.seq) return;
      this.story = s;
      if (s.client_id && s.engine_ids) this.family = { client: s.client_id, ids: s.engine_ids };
      else if (!this.family || !this.family.ids.includes(s.request_id)) this.family = null;
      this.render(s);
      setText(this.status, `as of ${clockText(Date.now() / 1000)}`);
      this.el.dataset.state = s.state;
    } catch (err) {
      if (seq !== this.seq) return;
      this.story = null;
      this.el.dataset.state = "error";
      setText(this.status, "");
      this.body.replaceChildren(h("p", { class: "muted", id: "rv-error" }, err.status === 404 ? err.message : `GET story: ${err.message}`));
    }
  }

  /**
   * From a KV event's hash: the running requests that hold it (the event log has no request ids).
   * @param {string} hex
   */
  async fromHash(hex) {
    if (!this.opts.holdersOf) return;
    setText(this.status, "finding who holds it…");
    const rids = await this.opts.holdersOf(hex);
    if (rids.length) return this.show(rids[0]);
    setText(this.status, "");
    this.body.replaceChildren(h("p", { class: "muted", id: "rv-error" }, `no running request holds hash ${hex.slice(0, 16)} now (a KV event names hashes, not requests)`));
  }

  /**
   * On a mirror, found by the client's id: vLLM's requests made of it (one
   * per sample when n > 1), each a button showing its story.
   * @param {RequestStory} s
   */
  familyLine(s) {
    const f = this.family;
    if (!f) return [];
    const many = f.ids.length > 1;
    return [
      h(
        "div",
        { class: "summary", id: "rv-family", "data-client": f.client, title: "vLLM gives each request it is handed the client's id, the prompt's index and 8 characters of its own; with n > 1 each sample is a request of its own" },
        h("span", null, "client's id ", h("b", { class: "mono" }, f.client), ` → vLLM's request${many ? `s (${f.ids.length}, one per sample)` : ""}:`),
        ...f.ids.map((id) =>
          id === s.request_id
            ? h("span", { class: "mono", "data-engine-id": id, "aria-current": "true" }, h("b", null, id))
            : h("button", { type: "button", class: "small mono", "data-engine-id": id, onclick: () => this.show(id, { scroll: false }) }, id),
        ),
      ),
    ];
  }

  /** @param {RequestStory} s */
  render(s) {
    /** @type {Record<string, number | null | undefined>} */
    const t = s.times || {};
    const t0 = t.first_attempt_at ?? t.admitted_at;
    const misses = Object.entries(s.misses || {}).sort((a, b) => b[1] - a[1]);
    const told = Boolean(s.sources && s.sources.engine); // a mirrored engine's request: no decode steps told
    const summary = h(
      "div",
      { class: "summary", id: "rv-summary" },
      h("span", null, h("b", { class: "mono", id: "rv-rid" }, s.request_id), " ", h("span", { id: "rv-state", class: `rv-state st-${s.state}` }, s.state)),
      h("span", null, `${int(s.num_prompt_tokens)} prompt tokens · ${int(s.num_tokens)} now`),
      h("span", { id: "rv-hits" }, "hit ", h("b", null, int(s.num_hit_blocks)), ` blocks (${int(s.hit_tokens)} tokens)`),
      h("span", { id: "rv-misses" }, misses.length ? `missed: ${misses.map(([r, n]) => `${REASON_LABEL[r] || r} ${n}`).join(", ")}` : "no prompt block missed"),
    );
    const times = h(
      "table",
      { class: "kv rv-times", id: "rv-times", style: "width:auto" },
      .../** @type {[string, number | null | undefined, string][]} */ ([
        ["first tried", t.first_attempt_at, s.admissions_refused ? `${s.admissions_refused} refusal(s) while it waited` : ""],
        ["admitted", t.admitted_at, s.preemptions ? `${int(s.preemptions)} preemption(s)` : ""],
        ["first decode", t.first_decode_at, ""],
        ["last decode", t.last_decode_at, s.decode ? (told ? `${int(s.decode.tokens)} tokens generated` : `${int(s.decode.steps)} steps, ${int(s.decode.tokens)} tokens, ${int(s.decode.new_blocks)} new blocks`) : ""],
        ["finished", t.finished_at, ""],
      ]).map(([k, ts, note]) =>
        h(
          "tr",
          { "data-time": k },
          h("th", null, k),
          told && k.endsWith("decode") ? h("td", null, unknownEl(NO_DECODE)) : h("td", { class: "mono" }, clockText(ts, "—"), h("span", { class: "muted" }, after(ts, t0))),
          h("td", { class: "muted" }, note),
        ),
      ),
    );
    const cells = blockCells(s, (this.opts.blockSize && this.opts.blockSize()) || 16);
    const line = h("div", { class: "rq-hover mono", id: "rv-hover" }, "hover a bar: that block");
    const strip = renderBars(document, cells, (c) => setText(line, c ? describeCell(c) : "hover a bar: that block"));
    strip.id = "rv-bars";
    strip.addEventListener("click", (ev) => {
      const c = cellAt(cells, ev);
      if (c && c.blockId !== null && this.opts.onBlock) this.opts.onBlock(c.blockId);
    });
    const legend = h("div", { class: "legend rq-legend" }, ...cellCounts(cells).map(([k, n]) => h("span", { class: "lg" }, `${REASON_LABEL[k] || k} ${n}`)));
    const rows = (s.blocks || []).map((b) =>
      h(
        "tr",
        { "data-index": String(b.index), "data-reason": b.reason || (b.hit ? "hit" : b.kind) },
        h("td", { class: "num" }, String(b.index)),
        h(
          "td",
          { class: "mono" },
          ...(b.block_ids || []).map((id) => h("a", { href: "#", "data-block": String(id), onclick: (/** @type {MouseEvent} */ ev) => (ev.preventDefault(), this.opts.onBlock && this.opts.onBlock(id)) }, `#${id} `)),
        ),
        h("td", null, b.kind === "decode" ? "decode" : b.hit ? "hit" : REASON_LABEL[b.reason || ""] || b.reason || "—"),
        h("td", { class: "muted" }, b.kind === "decode" && b.added_at ? `added ${clockText(b.added_at)}` : ""),
      ),
    );
    const timeline = (s.timeline || []).map((x) =>
      h("tr", { "data-op": x.op, "data-seq": String(x.seq) }, h("td", { class: "num" }, String(x.seq)), h("td", { class: "mono" }, clockText(x.ts, "—")), h("td", null, x.op), h("td", { class: x.ok ? "" : "err" }, stepText(x))),
    );
    if (s.timeline_omitted) timeline.splice(Math.ceil(timeline.length / 2), 0, h("tr", { class: "gap" }, h("td", { colspan: 4, class: "muted" }, `… ${int(s.timeline_omitted)} operations left out`)));
    const src = s.sources || {};
    const rec = src.recording;
    const foot = h(
      "div",
      { class: "an-foot muted", id: "rv-sources" },
      `from: ${[src.running ? "the running request" : null, src.miss_reasons ? "the miss analysis" : null, src.engine ? "the engine's plugin (a mirror: no block tables, no decode steps; miss reasons from hashes)" : null, rec && rec.operations_found ? `the recording (op seq ${rec.first_seq}..${rec.last_seq})` : null].filter(Boolean).join(", ") || "—"}` +
        `${s.earlier_lives ? ` · ${s.earlier_lives} earlier use(s) of this id left out` : ""}` +
        ` · kept: ${int(s.limits.finished_requests_kept)} finished requests, ${int(s.limits.recording_max_ops)} recorded operations`,
    );
    this.body.replaceChildren(
      summary,
      ...this.familyLine(s),
      times,
      h("div", { class: "an-sub" }, "blocks ", h("span", { class: "muted" }, "· click: show it in the block detail")),
      strip,
      legend,
      line,
      h("div", { class: "scroll an-scroll", style: "max-height: 220px" }, h("table", { class: "grid-table an-table", id: "rv-blocks" }, h("thead", null, h("tr", null, h("th", { class: "num" }, "#"), h("th", null, "block ids"), h("th", null, "hit / why missed"), h("th", null, ""))), h("tbody", null, ...rows))),
      h("div", { class: "an-sub" }, "operations"),
      h("div", { class: "scroll an-scroll", style: "max-height: 180px" }, h("table", { class: "grid-table an-table", id: "rv-timeline" }, h("tbody", null, ...timeline))),
      foot,
    );
  }
}
