// @ts-check
// One instance's hash map: paged, searchable, sortable, in the shared table
// (common/hashmaptable.js) -- drawn from the page's own copy of the map (InstanceMap, kept by fleet/sync.js from one
// snapshot and the stream's events), never read from REST page by page.

import { renderKeyRows } from "../common/hashmaptable.js";
import { $, debounce, h, hashCell, int, tokensText } from "./dom.js";

const PAGE = 50;

export class HashMapView {
  /** @param {{onPick: (hash: string) => void}} opts */
  constructor({ onPick }) {
    this.offset = 0;
    this.onPick = onPick;
    this.body = $("hashmap", HTMLTableElement).tBodies[0]; // fleet.html gives the table its tbody
    /** @type {import("./instancemap.js").InstanceMap | null} */
    this.map = null;
    this.exact = false;
    const reset = () => {
      this.offset = 0;
      this.render();
    };
    $("hm-search").addEventListener("input", debounce(reset, 250));
    $("hm-multi").addEventListener("change", reset);
    $("hm-sort").addEventListener("change", reset);
    $("hm-prev").addEventListener("click", () => {
      this.offset = Math.max(0, this.offset - PAGE);
      this.render();
    });
    $("hm-next").addEventListener("click", () => {
      this.offset += PAGE;
      this.render();
    });
  }

  /** @param {string | null} name */
  select(name) {
    $("hm-instance").textContent = name || "—";
    this.offset = 0;
  }

  /**
   * The map to draw, and whether the instance is exact (its health).
   * @param {import("./instancemap.js").InstanceMap} map
   * @param {boolean} exact
   */
  show(map, exact) {
    this.map = map;
    this.exact = exact;
    this.render();
  }

  /** The rows the search, the filter and the order select (as GET /api/fleet/{name}/hashmap would). */
  rows() {
    const map = this.map;
    if (!map) return [];
    const needle = $("hm-search", HTMLInputElement).value.trim().toLowerCase().replace(/^0x/, "");
    const multiOnly = $("hm-multi", HTMLInputElement).checked;
    const sort = $("hm-sort", HTMLSelectElement).value;
    let items = [...map.entries.values()];
    if (multiOnly) items = items.filter((e) => e.copies > 1);
    if (needle) items = items.filter((e) => e.hash.startsWith(needle) || (e.hash_int !== null && e.hash_int.startsWith(needle)));
    if (sort === "copies") items.sort((a, b) => b.copies - a.copies);
    else if (sort === "depth") {
      const depths = map.depths();
      items.sort((a, b) => (depths.get(b.hash) || 0) - (depths.get(a.hash) || 0));
    }
    return items;
  }

  render() {
    const exact = $("hm-exact");
    exact.textContent = this.exact ? "exact" : "inexact";
    exact.className = this.exact ? "badge exact" : "badge inexact";
    const map = this.map;
    if (!map || map.logSeq === null) {
      renderKeyRows(this.body, [], { hashCell, empty: "reading…", columns: 7 });
      $("hm-page").textContent = "";
      return;
    }
    const items = this.rows();
    if (this.offset >= items.length) this.offset = Math.max(0, Math.floor((items.length - 1) / PAGE) * PAGE);
    const page = items.slice(this.offset, this.offset + PAGE);
    renderKeyRows(
      this.body,
      page.map((it) => {
        const groups = Object.entries(it.groups || {}).filter(([g]) => g !== "-");
        const media = Object.entries(it.media || {})
          .map(([m, n]) => `${m}×${n}`)
          .concat(groups.map(([g, n]) => `g${g}×${n}`))
          .join(" ");
        const lora = it.lora_name ? `${it.lora_name}${it.lora_id !== null ? ` (${it.lora_id})` : ""}` : "";
        return {
          hash: it.hash,
          copies: it.copies,
          copiesAt: 1,
          title: it.hash_int ? `int ${it.hash_int}` : "",
          onClick: () => this.onPick(it.hash),
          cells: [
            hashCell(it.parent),
            h("td", { class: "num" }, int(it.copies)),
            h("td", {}, media),
            h("td", { class: "toks", title: (it.tokens || []).join(" ") }, tokensText(it.tokens, it.num_tokens)),
            h("td", {}, lora),
            h("td", { class: "num" }, `#${int(it.stored_seq)}`),
          ],
        };
      }),
      { hashCell, empty: map.entries.size ? "no match" : "no cached blocks seen yet", columns: 7 },
    );
    const end = this.offset + page.length;
    $("hm-page").textContent = `${items.length ? int(this.offset + 1) : 0}–${int(end)} of ${int(items.length)} (${int(map.entries.size)} keys, ${int(map.blocks)} blocks${map.truncated ? ", snapshot cut short" : ""})`;
    $("hm-prev", HTMLButtonElement).disabled = this.offset === 0;
    $("hm-next", HTMLButtonElement).disabled = end >= items.length;
  }
}
