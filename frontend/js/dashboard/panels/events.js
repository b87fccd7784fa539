// @ts-check
// The KV event log: compact arrays from the stream, newest first, with their
// sequence numbers; filter by type and hash, pause, and see gaps (events a
// frame left out or a resync skipped), which can be loaded from
// GET /api/events?since=.

import { get } from "../../common/api.js";
import { $, h, setText } from "../../common/dom.js";
import { int } from "../../common/format.js";
import { EVENT_NAMES, EV_CLEARED, EV_REMOVED, EV_STORED, eventHash64 } from "../wire/protocol.js";

const ROWS = 150;
/** @type {Record<number, string>} */
const TYPE_CLASS = { 0: "ev-stored", 1: "ev-removed", 2: "ev-cleared" };

/** @typedef {import("../wire/protocol.js").WireEvent} WireEvent */

/**
 * One event of GET /api/events (the hash fields: BlockStored, and BlockRemoved's block_hashes).
 * @typedef {{seq: number, type: string, block_hashes: string[], parent_block_hash: string | null, token_ids: number[], block_size: number, lora_name: string | null}} RestEvent
 */

/**
 * A REST event as a compact array.
 * @param {RestEvent} e
 * @returns {WireEvent}
 */
function compact(e) {
  if (e.type === "BlockStored") {
    return [e.seq, EV_STORED, e.block_hashes, e.parent_block_hash, e.token_ids.length, e.block_size, e.lora_name];
  }
  if (e.type === "BlockRemoved") return [e.seq, EV_REMOVED, e.block_hashes];
  return [e.seq, EV_CLEARED];
}

/**
 * Does a compact event match the type set and the hash filter?
 * @param {WireEvent} e
 * @param {Set<number>} types
 * @param {string} hashQuery
 */
export function eventMatches(e, types, hashQuery) {
  if (!types.has(e[1])) return false;
  if (!hashQuery) return true;
  if (e[1] === EV_CLEARED) return false;
  for (const x of e[2]) if (eventHash64(x).startsWith(hashQuery) || String(x).startsWith(hashQuery)) return true;
  return e[1] === EV_STORED && e[3] !== null && eventHash64(e[3]).startsWith(hashQuery);
}

export class EventLog {
  /** @param {import("../state/model.js").PoolModel} model */
  constructor(model) {
    this.model = model;
    this.body = $("ev-body");
    this.status = $("ev-status");
    this.pauseBtn = $("ev-pause");
    this.hashInput = $("ev-hash", HTMLInputElement);
    /** @type {((hex: string) => void) | null} the page's request story (set by main.js) */
    this.onStory = null;
    this.paused = false;
    this.pausedAtSeq = 0;
    /** @type {WireEvent[]} events loaded from REST to fill gaps */
    this.extra = [];
    this.renderedTop = -1;
    this.dirty = true;
    this.pauseBtn.addEventListener("click", () => this.setPaused(!this.paused));
    for (const box of /** @type {NodeListOf<HTMLInputElement>} */ (document.querySelectorAll("[data-evtype]"))) {
      box.addEventListener("change", () => (this.dirty = true));
    }
    this.hashInput.addEventListener("input", () => (this.dirty = true));
  }

  /** @param {boolean} p */
  setPaused(p) {
    this.paused = p;
    this.pausedAtSeq = this.lastSeq();
    this.pauseBtn.textContent = p ? "Resume" : "Pause";
    this.pauseBtn.classList.toggle("on", p);
    this.dirty = true;
  }

  lastSeq() {
    const ev = this.model.events;
    return ev.length ? ev[ev.length - 1][0] : 0;
  }

  types() {
    /** @type {Set<number>} */
    const t = new Set();
    for (const box of /** @type {NodeListOf<HTMLInputElement>} */ (document.querySelectorAll("[data-evtype]"))) if (box.checked) t.add(Number(box.dataset.evtype));
    return t;
  }

  /**
   * Load the events missing between two seqs from REST (at most 1,000).
   * @param {number} after
   * @param {number} before
   */
  async fill(after, before) {
    try {
      const data = await get(`/api/events?since=${after}&limit=${Math.min(1000, before - after - 1)}`);
      for (const e of data.items) if (e.seq < before) this.extra.push(compact(e));
      this.extra.sort((a, b) => a[0] - b[0]);
      if (this.extra.length > 5000) this.extra.splice(0, this.extra.length - 5000);
      this.dirty = true;
    } catch {
      /* the error line shows it */
    }
  }

  update() {
    const m = this.model;
    const last = this.lastSeq();
    const total = m.header.events_last_seq ?? last;
    if (this.paused) {
      setText(this.status, `paused at #${int(this.pausedAtSeq)} · ${int(Math.max(0, last - this.pausedAtSeq))} new`);
      if (!this.dirty) return;
    } else {
      setText(
        this.status,
        `last #${int(total)}${m.eventsOmitted ? ` · ${int(m.eventsOmitted)} left out of frames` : ""}`,
      );
      if (!this.dirty && last === this.renderedTop) return;
    }
    this.dirty = false;
    this.renderedTop = last;
    const types = this.types();
    const q = this.hashInput.value.trim().toLowerCase();
    const limitSeq = this.paused ? this.pausedAtSeq : Infinity;
    const merged = this.merge(m.events, this.extra);
    /** @type {HTMLElement[]} */
    const rows = [];
    /** @type {number | null} */
    let prevSeq = null;
    for (let i = merged.length - 1; i >= 0 && rows.length < ROWS; i--) {
      const e = merged[i];
      if (e[0] > limitSeq) continue;
      if (prevSeq !== null && prevSeq - e[0] > 1 && !q && types.size === 3) {
        rows.push(this.gapRow(e[0], prevSeq));
      }
      prevSeq = e[0];
      if (eventMatches(e, types, q)) rows.push(this.row(e, q));
    }
    this.body.replaceChildren(...rows);
  }

  /**
   * Two seq-sorted event lists as one, sorted, each seq once.
   * @param {WireEvent[]} a
   * @param {WireEvent[]} b
   */
  merge(a, b) {
    if (!b.length) return a;
    const out = a.concat(b);
    out.sort((x, y) => x[0] - y[0]);
    /** @type {WireEvent[]} */
    const dedup = [];
    for (const e of out) if (!dedup.length || dedup[dedup.length - 1][0] !== e[0]) dedup.push(e);
    return dedup;
  }

  /**
   * @param {number} after the last seq before the gap
   * @param {number} before the first seq after it
   */
  gapRow(after, before) {
    const n = before - after - 1;
    return h(
      "tr",
      { class: "gap" },
      h(
        "td",
        { colspan: "5" },
        `⋯ ${int(n)} event${n === 1 ? "" : "s"} not in the stream (#${after + 1}–#${before - 1}) `,
        h("button", { class: "link", onclick: () => this.fill(after, before) }, "load"),
      ),
    );
  }

  /**
   * @param {WireEvent} e
   * @param {string} q the hash filter (its match goes first)
   */
  row(e, q) {
    const [seq, type] = e;
    const hashes = type === EV_CLEARED ? [] : e[2].map(eventHash64);
    if (q) {
      // the hash that matched the filter goes first
      const i = hashes.findIndex((x) => x.startsWith(q));
      if (i > 0) hashes.unshift(...hashes.splice(i, 1));
    }
    const shown = hashes.slice(0, 1).join(" ");
    const more = hashes.length > 1 ? ` +${hashes.length - 1}` : "";
    const parent = type === EV_STORED && e[3] ? eventHash64(e[3]).slice(0, 8) : "";
    const info = type === EV_STORED ? `${e[4]} tok${e[6] ? ` · ${e[6]}` : ""}` : "";
    return h(
      "tr",
      { class: TYPE_CLASS[type] || "" },
      h("td", { class: "num" }, String(seq)),
      h("td", null, EVENT_NAMES[type] || String(type)),
      h("td", { class: "mono", title: hashes.join("\n") }, shown, more),
      h("td", { class: "mono" }, parent),
      h(
        "td",
        null,
        info,
        // its own word, apart from the token count: "16 tok · who?"
        type === EV_STORED && hashes.length ? " · " : null,
        type === EV_STORED && hashes.length ? h("button", { class: "link", "data-story-hash": hashes[0], title: "the story of the request holding this block now", onclick: () => this.onStory && this.onStory(hashes[0]) }, "who?") : null,
      ),
    );
  }
}
