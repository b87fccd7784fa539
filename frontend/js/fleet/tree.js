// @ts-check
// One instance's prefix tree (parents from BlockStored), expanded on demand.

import { getJSON } from "./api.js";
import { $, clear, h, int, shortHash } from "./dom.js";

const MAX_CHILDREN = 200;

/**
 * One node of an instance's prefix tree (the observer's GET /api/fleet/{name}/prefix-tree).
 * @typedef {{hash: string, parent: string | null, depth: number, copies: number, orphan?: boolean, tokens?: number[], num_tokens: number, lora_name?: string | null}} FleetTreeNode
 */

export class TreeView {
  /** @param {{onPick: (hash: string) => void, onError: (err: Error) => void}} opts */
  constructor({ onPick, onError }) {
    this.instance = null;
    this.onPick = onPick;
    this.onError = onError;
    this.open = new Set();
    $("tree-refresh").addEventListener("click", () => this.load());
  }

  /** @param {string | null} name */
  select(name) {
    this.instance = name;
    this.open.clear();
    $("tree-instance").textContent = name || "—";
    this.load();
  }

  async load() {
    if (!this.instance) return;
    try {
      const tree = await getJSON(`/api/fleet/${encodeURIComponent(this.instance)}/prefix-tree`, { limit: 5000 });
      this.render(tree);
    } catch (err) {
      this.onError(err);
    }
  }

  /**
   * @param {{nodes: FleetTreeNode[], total: number, roots: number, truncated?: boolean}} tree GET /api/fleet/{name}/prefix-tree
   */
  render(tree) {
    /** @type {Map<string | null, FleetTreeNode[]>} */
    const byParent = new Map();
    /** @type {FleetTreeNode[]} */
    const roots = [];
    for (const n of tree.nodes) {
      if (n.depth === 1) roots.push(n);
      else {
        const siblings = byParent.get(n.parent);
        if (siblings) siblings.push(n);
        else byParent.set(n.parent, [n]);
      }
    }
    $("tree-info").textContent = `${int(tree.total)} nodes · ${int(tree.roots)} roots${tree.truncated ? ` · first ${int(tree.nodes.length)}` : ""}`;
    const box = $("tree");
    clear(box);
    if (!roots.length) {
      box.append(h("div", { class: "muted" }, "no cached blocks seen yet"));
      return;
    }
    box.append(this.list(roots, byParent));
  }

  /**
   * @param {FleetTreeNode[]} nodes
   * @param {Map<string | null, FleetTreeNode[]>} byParent
   * @returns {HTMLElement}
   */
  list(nodes, byParent) {
    const ul = h("ul");
    for (const n of nodes.slice(0, MAX_CHILDREN)) {
      const kids = byParent.get(n.hash) || [];
      const isOpen = this.open.has(n.hash);
      const li = h(
        "li",
        { "data-hash": n.hash },
        h(
          "span",
          {
            class: "tog",
            onclick: () => {
              if (this.open.has(n.hash)) this.open.delete(n.hash);
              else this.open.add(n.hash);
              const fresh = this.list([n], byParent).firstChild; // the one node's <li>
              if (fresh) li.replaceWith(fresh);
            },
          },
          kids.length ? (isOpen ? "▾" : "▸") : "·",
        ),
        h("span", { class: "h", title: n.hash, onclick: () => this.onPick(n.hash) }, shortHash(n.hash)),
        " ",
        h(
          "span",
          { class: n.orphan ? "meta orphan" : "meta", title: n.orphan ? "its parent is not held (evicted first, or stored before the observer joined)" : "" },
          `×${n.copies} · [${(n.tokens || []).join(" ")}${n.num_tokens > (n.tokens || []).length ? " …" : ""}]`,
          n.lora_name ? ` · ${n.lora_name}` : "",
          kids.length ? ` · ${kids.length} child${kids.length === 1 ? "" : "ren"}` : "",
          n.orphan ? " · orphan" : "",
        ),
      );
      if (isOpen && kids.length) li.append(this.list(kids, byParent));
      ul.append(li);
    }
    if (nodes.length > MAX_CHILDREN) ul.append(h("li", { class: "muted" }, `… ${int(nodes.length - MAX_CHILDREN)} more`));
    return ul;
  }
}
