// @ts-check
// One instance's hash map: paged, searchable, sortable.

import { getJSON } from "./api.js";
import { $, clear, debounce, h, hashCell, int, tokensText } from "./dom.js";

const PAGE = 50;

export class HashMapView {
  /** @param {{onPick: (hash: string) => void, onError: (err: Error) => void}} opts */
  constructor({ onPick, onError }) {
    this.instance = null;
    this.offset = 0;
    this.onPick = onPick;
    this.onError = onError;
    this.body = $("hashmap", HTMLTableElement).tBodies[0]; // fleet.html gives the table its tbody
    this.loading = false;
    this.again = false;
    $("hm-search").addEventListener("input", debounce(() => this.reset(), 250));
    $("hm-multi").addEventListener("change", () => this.reset());
    $("hm-sort").addEventListener("change", () => this.reset());
    $("hm-prev").addEventListener("click", () => {
      this.offset = Math.max(0, this.offset - PAGE);
      this.load();
    });
    $("hm-next").addEventListener("click", () => {
      this.offset += PAGE;
      this.load();
    });
  }

  /** @param {string | null} name */
  select(name) {
    this.instance = name;
    $("hm-instance").textContent = name || "—";
    this.reset();
  }

  reset() {
    this.offset = 0;
    this.load();
  }

  async load() {
    if (!this.instance) return;
    if (this.loading) {
      this.again = true;
      return;
    }
    this.loading = true;
    try {
      const page = await getJSON(`/api/fleet/${encodeURIComponent(this.instance)}/hashmap`, {
        offset: this.offset,
        limit: PAGE,
        q: $("hm-search", HTMLInputElement).value.trim(),
        multi_only: $("hm-multi", HTMLInputElement).checked ? "true" : "",
        sort: $("hm-sort", HTMLSelectElement).value,
      });
      this.render(page);
    } catch (err) {
      this.onError(err);
    } finally {
      this.loading = false;
      if (this.again) {
        this.again = false;
        this.load();
      }
    }
  }

  render(page) {
    const exact = $("hm-exact");
    exact.textContent = page.exact ? "exact" : "inexact";
    exact.className = page.exact ? "badge exact" : "badge inexact";
    clear(this.body);
    for (const it of page.items) {
      const groups = Object.entries(it.groups || {}).filter(([g]) => g !== "-");
      const media = Object.entries(it.media || {})
        .map(([m, n]) => `${m}×${n}`)
        .concat(groups.map(([g, n]) => `g${g}×${n}`))
        .join(" ");
      const lora = it.lora_name ? `${it.lora_name}${it.lora_id !== null ? ` (${it.lora_id})` : ""}` : "";
      this.body.append(
        h(
          "tr",
          { "data-hash": it.hash, onclick: () => this.onPick(it.hash), title: it.hash_int ? `int ${it.hash_int}` : "" },
          hashCell(it.hash),
          hashCell(it.parent),
          h("td", { class: "num" }, int(it.copies)),
          h("td", {}, media),
          h("td", { class: "toks", title: (it.tokens || []).join(" ") }, tokensText(it.tokens, it.num_tokens)),
          h("td", {}, lora),
          h("td", { class: "num" }, `#${int(it.stored_seq)}`),
        ),
      );
    }
    if (!page.items.length) {
      this.body.append(h("tr", {}, h("td", { colspan: "7", class: "muted" }, page.total_keys ? "no match" : "no cached blocks seen yet")));
    }
    const end = Math.min(page.offset + page.items.length, page.matched);
    $("hm-page").textContent = `${page.matched ? int(page.offset + 1) : 0}–${int(end)} of ${int(page.matched)} (${int(page.total_keys)} keys, ${int(page.blocks)} blocks)`;
    $("hm-prev", HTMLButtonElement).disabled = page.offset === 0;
    $("hm-next", HTMLButtonElement).disabled = end >= page.matched;
  }
}
