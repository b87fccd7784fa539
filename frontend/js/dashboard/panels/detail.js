// @ts-check
// The block detail panel: what the model knows at once, then the REST view
// (GET /api/blocks/{id}: holders, digest, queue position, sampled metrics).
// Highlights on the map: every block of the same request (holders +
// GET /api/requests/{id}) and of the same hash (the hash index).  A
// request's prompt blocks as bars: hit, or why each missed (running
// requests from GET /api/requests/{id}, finished ones from
// GET /api/misses/requests/{id}).  A block's title and rows, and a block of
// a recorded moment: blockdetail.js.

import { REASON_LABEL, REASON_RGB } from "../state/missreasons.js";
import { ApiError, api, get } from "../../common/api.js";
import { $, h } from "../../common/dom.js";
import { dur, int } from "../../common/format.js";
import { rgba } from "../../common/palette.js";
import { explain } from "../../common/terms.js";
import { blockCells, cellCounts, describeCell, renderBars } from "../render/reqbars.js";
import { STATE_NAMES, hex64 } from "../wire/protocol.js";
import { blockTitle, kvRows, renderMoment } from "./blockdetail.js";

/**
 * A request whose blocks are highlighted (GET /api/requests/{id}, or the
 * analysis's misses of a finished one); `error` when neither answered.
 * @typedef {object} ShownRequest
 * @property {string} id
 * @property {number[]} blocks
 * @property {number} [hits]
 * @property {number} [tokens]
 * @property {import("../render/reqbars.js").Cell[]} [cells]
 * @property {number} [fetchedAt] performance.now() of the answer
 * @property {boolean} [finished]
 * @property {string} [error]
 */

export class DetailPanel {
  /**
   * @param {import("../state/model.js").PoolModel} model
   * @param {import("../render/blockmap.js").BlockMap} map
   * @param {(pos: number | null) => number | null} queueEta seconds until queue position `pos` is reused
   */
  constructor(model, map, queueEta) {
    this.model = model;
    this.map = map;
    this.queueEta = queueEta; // pos -> seconds
    this.root = $("detail-body");
    this.title = $("detail-title");
    this.pinned = -1;
    /** @type {((rid: string) => void) | null} the page's request story (set by main.js) */
    this.onStory = null;
    this.shown = -1;
    this.rest = null;
    this.restFor = -1;
    /** @type {ShownRequest | null} */
    this.request = null;
    /** @type {number | undefined} the pending fetch of a hovered block */
    this.hoverTimer = undefined;
    this.fetchSeq = 0;
    this.requestSeq = 0;
    this.barHover = "";
    /** @type {((request: ShownRequest) => void) | null} */
    this.onRequestHighlight = null;
    /** @type {(import("../state/history.js").Moment & {id: number}) | null} a recorded moment (time travel) shown instead of the live pool, and its block shown */
    this.moment = null;
    document.addEventListener("keydown", (ev) => {
      if (ev.key === "Escape") this.select(-1);
    });
  }

  /**
   * Hover: show at once; fetch REST after a short pause.
   * @param {number} id
   */
  hover(id) {
    if (this.pinned >= 0) return;
    this.show(id);
  }

  /**
   * Click: pin (or unpin with -1 / the same block).
   * @param {number} id
   */
  select(id) {
    if (id >= 0 && id === this.pinned) id = -1;
    this.pinned = id;
    this.map.setHighlight("selected", id);
    if (id < 0) {
      this.clearHighlights();
      this.show(-1);
      return;
    }
    this.show(id, true);
  }

  clearHighlights() {
    this.request = null;
    this.requestSeq++;
    this.map.setHighlight("request", []);
    this.map.setHighlight("hash", []);
  }

  /**
   * @param {number} id
   * @param {boolean} [now] fetch at once
   */
  show(id, now = false) {
    this.shown = id;
    clearTimeout(this.hoverTimer);
    if (id < 0) {
      this.rest = null;
      this.restFor = -1;
      this.render();
      return;
    }
    if (this.restFor !== id) this.rest = null;
    this.render();
    this.hoverTimer = setTimeout(() => this.fetch(id), now ? 0 : 150);
  }

  /** @param {number} id */
  async fetch(id) {
    const seq = ++this.fetchSeq;
    try {
      const data = await get(`/api/blocks/${id}`);
      if (seq !== this.fetchSeq || this.shown !== id) return;
      this.rest = data;
      this.restFor = id;
      if (this.pinned === id) {
        this.highlightHash(id);
        if (data.requests.length && (!this.request || !data.requests.includes(this.request.id))) {
          await this.highlightRequest(data.requests[0]);
        } else if (!data.requests.length) {
          this.request = null;
          this.map.setHighlight("request", []);
        }
      }
      this.render();
    } catch (err) {
      if (seq === this.fetchSeq) {
        this.rest = { error: err.message };
        this.restFor = id;
        this.render();
      }
    }
  }

  /** @param {number} id */
  highlightHash(id) {
    const m = this.model;
    const ids = m.index && m.hashed[id] ? m.index.sameAs(id) : [];
    this.map.setHighlight("hash", ids.length > 1 ? ids : []);
    this.sameHash = ids;
  }

  /** @param {string} rid */
  async highlightRequest(rid) {
    const seq = ++this.requestSeq;
    try {
      const req = await get(`/api/requests/${encodeURIComponent(rid)}`);
      if (seq !== this.requestSeq) return;
      /** @type {number[]} */
      const ids = [];
      for (const b of req.blocks) for (const x of b.block_ids) if (x > 0) ids.push(x);
      this.request = { id: rid, blocks: ids, hits: req.num_hit_blocks, tokens: req.num_tokens, cells: this.cells(req), fetchedAt: performance.now() };
      this.map.setHighlight("request", ids);
      if (this.onRequestHighlight) this.onRequestHighlight(this.request);
    } catch (err) {
      if (seq !== this.requestSeq) return;
      this.request = { id: rid, blocks: [], error: err.message };
      this.map.setHighlight("request", []);
      if (err instanceof ApiError && err.status === 404) await this.finishedRequest(rid, seq);
    }
    this.render();
  }

  /**
   * A request that is no longer running: its misses, if the analysis still has them.
   * @param {string} rid
   * @param {number} seq the highlight asked for (a later one wins)
   */
  async finishedRequest(rid, seq) {
    try {
      const m = await api("GET", `/api/misses/requests/${encodeURIComponent(rid)}`, undefined, { quiet: true });
      if (seq !== this.requestSeq) return;
      this.request = { id: rid, blocks: [], finished: true, hits: m.num_hit_blocks, cells: this.cells(m), fetchedAt: performance.now() };
    } catch {
      /* not running, not remembered: the error stays */
    }
  }

  /** @param {import("../render/reqbars.js").RequestBlocks} req */
  cells(req) {
    const bs = (this.model.config && this.model.config.block_size) || 16;
    return blockCells(req, bs);
  }

  /** Reasons the worker had not reported yet: ask again (detail cadence). */
  refreshRequest() {
    const q = this.request;
    if (!q || !q.cells || q.finished) return;
    if (!q.cells.some((c) => c.kind === "pending")) return;
    if (performance.now() - (q.fetchedAt || 0) < 900) return;
    this.highlightRequest(q.id);
  }

  /** The request's prompt blocks as bars, with a legend and a hover line. */
  requestStrip() {
    const q = this.request;
    if (!q || !q.cells || !q.cells.length) return null;
    const line = h("div", { class: "rq-hover mono", id: "rq-hover" }, this.barHover || "hover a bar: why that block missed");
    const strip = renderBars(document, q.cells, (c) => {
      this.barHover = c ? describeCell(c) : "";
      line.textContent = this.barHover || "hover a bar: why that block missed";
    });
    strip.id = "rq-bars";
    strip.dataset.rid = q.id;
    const legend = cellCounts(q.cells).map(([k, n]) =>
      h("span", { class: "lg" }, h("i", { style: `background:${rgba(REASON_RGB[k] || REASON_RGB.pending)}` }), `${REASON_LABEL[k] || (k === "hit" ? "hit" : k)} ${n}`),
    );
    return h(
      "div",
      { class: "rq-strip" },
      h("div", { class: "ctl-title" }, `Request ${q.id}: prompt blocks`, q.finished ? h("span", { class: "muted" }, " (finished)") : ""),
      strip,
      h("div", { class: "legend rq-legend" }, ...legend),
      line,
    );
  }

  /**
   * Highlight a request's blocks without a block selected (controls panel).
   * @param {string} rid
   */
  async showRequest(rid) {
    this.map.setHighlight("hash", []);
    await this.highlightRequest(rid);
  }

  /**
   * Highlight the blocks of one hash (hash map / tree panels).
   * @param {number[]} ids
   */
  showHash(ids) {
    this.map.setHighlight("hash", ids);
  }

  /** In-use blocks by ref count: how much the running requests share. */
  sharing() {
    const m = this.model;
    const by = [0, 0, 0, 0];
    const { state, refCnt } = m;
    for (let i = 0; i < m.n; i++) {
      if (state[i] === 1) by[Math.min(refCnt[i], 4) - 1]++;
    }
    const total = by.reduce((a, b) => a + b, 0);
    const refs = by[0] + 2 * by[1] + 3 * by[2];
    let more = 0;
    for (let i = 0; i < m.n; i++) if (state[i] === 1 && refCnt[i] >= 4) more += refCnt[i];
    const rows = ["×1", "×2", "×3", "×4+"].map((label, i) =>
      h(
        "tr",
        null,
        h("th", null, `ref ${label}`),
        h("td", null, h("span", { class: "bar", style: `width:${total ? (100 * by[i]) / total : 0}%` }), ` ${int(by[i])}`),
      ),
    );
    const saved = refs + more - total;
    return h(
      "div",
      { class: "sharing" },
      h("div", { class: "ctl-title" }, "In-use blocks by reference count"),
      h("table", { class: "kv" }, ...rows),
      h(
        "p",
        { class: "muted" },
        `${int(refs + more)} block references held through ${int(total)} physical blocks: sharing saves ${int(saved)} blocks.`,
      ),
    );
  }

  /**
   * Follow a recorded moment ({st, src}), or the live pool again (null).
   * @param {import("../state/history.js").Moment | null} m
   */
  setMoment(m) {
    this.moment = m ? { ...m, id: this.moment ? this.moment.id : -1 } : null;
    this.render();
  }

  /**
   * A block of the recorded moment (a click on the map in history mode).
   * @param {number} id
   */
  showMoment(id) {
    if (!this.moment) return;
    this.moment.id = id;
    this.render();
  }

  /** @param {import("../state/history.js").Moment & {id: number}} moment */
  renderMoment(moment) {
    renderMoment(this.title, this.root, moment);
  }

  render() {
    if (this.moment) {
      this.renderMoment(this.moment);
      return;
    }
    const id = this.shown;
    const m = this.model;
    this.root.replaceChildren();
    if (id < 0 || id >= m.n) {
      this.title.textContent = "Block";
      const q = this.request;
      const tip = q
        ? q.finished
          ? `Request ${q.id} has finished: its blocks are no longer held.`
          : `Request ${q.id}: ${q.blocks.length} blocks highlighted`
        : "Hover a block for its details; click to pin it (Esc to unpin).";
      const strip = this.requestStrip();
      this.root.append(h("p", { class: "muted" }, tip), ...(strip ? [strip] : []), this.sharing());
      return;
    }
    const state = STATE_NAMES[m.state[id]];
    const hashed = m.hashed[id];
    const hex = hashed ? hex64(m.hash64[2 * id], m.hash64[2 * id + 1]) : null;
    this.title.replaceChildren(
      ...blockTitle(id, state),
      ...(this.pinned === id ? [h("span", { class: "pin", title: "pinned (Esc to unpin)" }, "pinned")] : []),
    );
    const r = this.restFor === id ? this.rest : null;
    const { rows, row } = kvRows();
    row("ref count", String(r && !r.error ? r.ref_cnt : m.refCnt[id]), { id: "detail-ref" });
    if (r && !r.error && r.raw_refs) row("raw refs", String(r.raw_refs));
    row("hash64", hex || "—", { id: "detail-hash", class: "mono" });
    if (r && r.block_hash) row("digest", `${r.block_hash.slice(0, 24)}…`, { class: "mono", title: r.block_hash });
    if (hashed) row("group", String(m.group[id]));
    if (hashed && this.sameHash && this.pinned === id) {
      row("copies", String(r && !r.error ? r.copies_under_hash : this.sameHash.length), { id: "detail-copies" });
    }
    const free = state === "cached" || state === "empty";
    if (free) {
      const pos = r && !r.error && r.queue_position !== null ? r.queue_position : m.queuePosition(id);
      row("queue position", `${int(pos)} (evicted in ~${dur(this.queueEta(pos))})`, { id: "detail-qpos" });
    } else {
      row("queue position", "— (not free)", { id: "detail-qpos" });
    }
    row("stamp", int(m.stamp[id]));
    if (r && !r.error) {
      const holders = r.requests.length
        ? r.requests.map((/** @type {string} */ rid) =>
            h(
              "button",
              {
                class: `chip${this.request && this.request.id === rid ? " on" : ""}`,
                onclick: () => this.highlightRequest(rid),
                title: "highlight this request's blocks",
              },
              rid,
            ),
          ).flatMap((/** @type {HTMLButtonElement} */ chip) => [chip, h("button", { class: "chip story", "data-story": chip.textContent, title: "its story: blocks, hits, misses, times", onclick: () => this.onStory && this.onStory(chip.textContent) }, "story")])
        : ["none"];
      rows.push(h("tr", null, h("th", { title: explain("holders") }, "holders"), h("td", { id: "detail-holders" }, ...holders)));
      const mt = r.metrics;
      row(
        "lifetime",
        mt ? `age ${dur(mt.age_seconds)} · idle ${dur(mt.idle_seconds)}` : "not sampled",
        { id: "detail-metrics" },
      );
      if (mt && mt.reuse_gaps_seconds.length) {
        row("reuse gaps", mt.reuse_gaps_seconds.slice(-6).map(dur).join(", "));
      }
    } else if (r && r.error) {
      row("details", r.error, { class: "err" });
    } else {
      row("details", "loading…", { class: "muted" });
    }
    this.root.append(h("table", { class: "kv" }, ...rows));
    if (this.request && this.pinned === id) {
      const q = this.request;
      this.root.append(
        h(
          "p",
          { class: "hl-note", id: "detail-request-note" },
          h("span", { class: "sw sw-req" }),
          `request ${q.id}: ${q.blocks.length} blocks`,
          q.hits !== undefined ? ` (${q.hits} prefix hits)` : "",
        ),
      );
      const strip = this.requestStrip();
      if (strip) this.root.append(strip);
    }
    if (this.sameHash && this.sameHash.length > 1 && this.pinned === id) {
      this.root.append(
        h("p", { class: "hl-note" }, h("span", { class: "sw sw-hash" }), `${this.sameHash.length} blocks share this hash`),
      );
    }
  }
}
