// @ts-check
// The hash map panel: keys (hash64, group) with their block(s) in the shared
// table (common/hashmaptable.js), keys that hold several physical copies
// first and highlighted, search by hash prefix
// (the local index, numerically) or by block id.  Longer (digest) prefixes
// go to GET /api/hashmap?hash=.

import { get } from "../../common/api.js";
import { $, h, setText } from "../../common/dom.js";
import { int } from "../../common/format.js";
import { renderKeyRows } from "../../common/hashmaptable.js";
import { hex64 } from "../wire/protocol.js";

const ROWS = 60;

/**
 * One key of the map as a row: its hash, group and blocks (`digest`: the full hash, from the server).
 * @typedef {{hex: string, group: number, ids: number[], digest?: string}} KeyRow
 */

export class HashMapPanel {
  /**
   * @param {import("../state/model.js").PoolModel} model
   * @param {(ids: number[]) => void} onBlocks highlight these blocks
   * @param {(id: number) => void} onSelect select a block
   */
  constructor(model, onBlocks, onSelect) {
    this.model = model;
    this.onBlocks = onBlocks; // highlight ids
    this.onSelect = onSelect; // select a block
    this.input = $("hm-search", HTMLInputElement);
    this.body = $("hm-body");
    this.stats = $("hm-stats");
    this.note = $("hm-note");
    /** @type {{items?: {hash64: string, group_id: number, block_ids: number[], block_hash: string}[], matched?: number, error?: string} | null} GET /api/hashmap?hash= for a digest prefix */
    this.remote = null;
    this.dirty = true;
    this.input.addEventListener("input", () => {
      this.remote = null;
      this.dirty = true;
      const q = this.input.value.trim().toLowerCase();
      if (/^[0-9a-f]{17,128}$/.test(q)) this.searchRemote(q);
    });
  }

  /** @param {string} q a digest prefix (GET /api/hashmap?hash=) */
  async searchRemote(q) {
    try {
      const data = await get(`/api/hashmap?hash=${q}&limit=${ROWS}`);
      if (this.input.value.trim().toLowerCase() !== q) return;
      this.remote = data;
      this.dirty = true;
    } catch (err) {
      this.remote = { items: [], error: err.message };
    }
  }

  update() {
    const m = this.model;
    const idx = m.index;
    if (m.seq === null || !idx) return;
    setText(
      this.stats,
      `${int(m.header.hash_map_keys)} keys · ${int(idx.blocks)} hashed blocks · ${int(idx.multi)} with several copies`,
    );
    const q = this.input.value.trim().toLowerCase();
    /** @type {KeyRow[]} */
    let items = [];
    let note = "";
    if (!q) {
      const multi = idx.multiSlots(ROWS);
      items = multi.map((s) => this.slotItem(idx, s));
      if (items.length < ROWS) {
        /** @type {number[]} */
        const rest = [];
        idx.forEach((s, _lo, _hi, _g, c) => {
          if (c < 2) rest.push(s);
          return rest.length < ROWS - items.length;
        });
        items.push(...rest.map((s) => this.slotItem(idx, s)));
      }
      note = idx.multi ? "keys with several physical copies first" : "no key holds several copies";
    } else if (/^#?\d+$/.test(q) && (q.startsWith("#") || !/[a-f]/.test(q)) && q.replace("#", "").length <= 8) {
      const id = Number(q.replace("#", ""));
      if (id < m.n && m.hashed[id]) items = [this.slotItem(idx, idx.slotOf[id])];
      note = id >= m.n ? `block #${id} is outside the pool` : m.hashed[id] ? `block #${id}` : `block #${id} is not hashed`;
      // digits are also a hash prefix: list those too
      if (!q.startsWith("#")) items.push(...idx.searchPrefix(q, ROWS).map((s) => this.slotItem(idx, s)));
    } else if (/^[0-9a-f]{1,16}$/.test(q)) {
      items = idx.searchPrefix(q, ROWS).map((s) => this.slotItem(idx, s));
      note = `${items.length}${items.length === ROWS ? "+" : ""} keys start with ${q}`;
    } else if (this.remote) {
      items = (this.remote.items || []).map((it) => ({
        hex: it.hash64,
        group: it.group_id,
        ids: it.block_ids,
        digest: it.block_hash,
      }));
      note = this.remote.error || `${int(this.remote.matched)} keys match the digest prefix (server)`;
    } else {
      note = /^[0-9a-f#]*$/.test(q) ? "searching…" : "hex hash prefix, or a block id (#123)";
    }
    setText(this.note, note);
    this.renderRows(items);
  }

  /**
   * @param {import("../state/hashindex.js").HashIndex} idx
   * @param {number} s a slot of it
   * @returns {KeyRow}
   */
  slotItem(idx, s) {
    return { hex: hex64(idx.kLo[s], idx.kHi[s]), group: idx.kGroup[s], ids: idx.idsOf(s) };
  }

  /** @param {KeyRow[]} items */
  renderRows(items) {
    renderKeyRows(
      this.body,
      items.map((it) => ({
        hash: it.hex,
        copies: it.ids.length,
        copiesAt: 1,
        title: it.digest || "",
        onClick: () => this.onBlocks(it.ids),
        cells: [
          h("td", { class: "num" }, String(it.group)),
          h("td", { class: "num" }, String(it.ids.length)),
          h(
            "td",
            { class: "ids" },
            ...it.ids.slice(0, 6).map((id) =>
              h(
                "a",
                {
                  href: "#",
                  onclick: (/** @type {MouseEvent} */ ev) => {
                    ev.preventDefault();
                    ev.stopPropagation();
                    this.onSelect(id);
                  },
                },
                `#${id}`,
              ),
            ),
            it.ids.length > 6 ? ` +${it.ids.length - 6}` : "",
          ),
        ],
      })),
      { hashCell: (hex) => h("td", { class: "mono" }, hex) },
    );
  }
}
