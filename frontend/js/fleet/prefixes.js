// @ts-check
// The fleet view a KV-aware router builds: which instances hold which
// prefixes, and for a request (its block hashes or tokens) how many leading
// blocks each instance has cached.

import { getJSON } from "./api.js";
import { $, clear, h, int, shortHash } from "./dom.js";

export class PrefixView {
  /** @param {{onError: (err: Error) => void}} opts */
  constructor({ onError }) {
    this.onError = onError;
    $("fp-form").addEventListener("submit", () => this.query());
    $("fp-refresh").addEventListener("click", () => this.families());
  }

  /**
   * Ask who holds the prefix a block hash stands for.
   * @param {string} hash
   */
  pick(hash) {
    $("fp-kind", HTMLSelectElement).value = "hash";
    $("fp-query", HTMLInputElement).value = hash;
    this.query();
  }

  async query() {
    const text = $("fp-query", HTMLInputElement).value.trim();
    if (!text) return;
    const kind = $("fp-kind", HTMLSelectElement).value;
    const params = kind === "hash" ? { hash: text.replace(/\s+/g, ",") } : { tokens: text.replace(/\s+/g, ",") };
    try {
      this.renderLookup(await getJSON("/api/fleet/prefixes", params));
    } catch (err) {
      clear($("fp-result"));
      $("fp-result").append(h("div", { class: "err" }, err.message));
    }
  }

  renderLookup(res) {
    const box = $("fp-result");
    clear(box);
    const q = res.query;
    const total = q.kind === "hashes" ? q.blocks : Math.max(1, ...res.instances.map((r) => r.leading_blocks));
    box.append(
      h(
        "div",
        { class: "muted" },
        q.kind === "hashes"
          ? `${q.blocks} block(s) in the prefix${q.chain_complete ? "" : " (its start is not held anywhere: known from there on)"}`
          : `${int(q.num_tokens)} tokens`,
      ),
    );
    for (const r of res.instances) {
      const pct = total ? (100 * r.leading_blocks) / total : 0;
      box.append(
        h(
          "div",
          { class: res.best.includes(r.instance) ? "bar best" : "bar", "data-instance": r.instance },
          h("span", { class: "mono", title: r.exact ? "" : "this pool is inexact: the answer may be wrong" }, `${r.instance}${r.exact ? "" : " ?"}`),
          h("span", { class: "track" }, h("span", { class: "fill", style: `width:${pct.toFixed(1)}%` })),
          h("span", { class: "mono" }, `${r.leading_blocks} blk · ${int(r.leading_tokens)} tok`),
        ),
      );
    }
  }

  async families() {
    try {
      const res = await getJSON("/api/fleet/prefixes", { limit: 30 });
      const body = $("families", HTMLTableElement).tBodies[0]; // fleet.html gives the table its tbody
      clear(body);
      for (const f of res.items) {
        body.append(
          h(
            "tr",
            { onclick: () => this.pick(f.root), "data-root": f.root },
            h("td", { class: "hash", title: f.root }, shortHash(f.root)),
            h("td", { class: "toks", title: f.first_tokens.join(" ") }, f.first_tokens.join(" ")),
            h(
              "td",
              {},
              h(
                "div",
                { class: "chips" },
                f.instances.map((i) => h("span", { class: "chip", title: `${i.blocks} block(s) under this first block` }, `${i.instance}: ${i.depth} (${i.blocks})`)),
              ),
            ),
          ),
        );
      }
      if (!res.items.length) body.append(h("tr", {}, h("td", { colspan: "3", class: "muted" }, "no cached blocks seen yet")));
    } catch (err) {
      this.onError(err);
    }
  }
}
