// @ts-check
// The prefix-tree panel: shared prefixes as a forest, single-child chains
// collapsed to one line ("a1b2c3d4… ─ 37 blocks ─ 9f2c0d1e…"), branches
// shown where requests diverge.  Built from PrefixTree (REST + events).

import { get } from "../../common/api.js";
import { $, h, setText } from "../../common/dom.js";
import { int, shortHash } from "../../common/format.js";
import { chainFrom, copiesFromIndex } from "../state/prefixtree.js";

const MAX_ROOTS = 24;
const MAX_CHILDREN = 6;
const MAX_DEPTH = 5;

export class TreePanel {
  /**
   * @param {import("../state/model.js").PoolModel} model
   * @param {import("../state/prefixtree.js").PrefixTree} tree
   * @param {(hexes: string[]) => void} onHash highlight the blocks of these hashes
   */
  constructor(model, tree, onHash) {
    this.model = model;
    this.tree = tree;
    this.onHash = onHash; // ([hex]) -> highlight their blocks
    this.root = $("tree-body");
    this.stats = $("tree-stats");
    this.loading = false;
    this.loadedEpoch = null;
    this.lastBuild = null;
  }

  /** (Re)load from REST: on start, after a snapshot (a resync may skip events). */
  async load() {
    if (this.loading) return;
    this.loading = true;
    try {
      const data = await get("/api/prefix-tree?limit=50000");
      this.tree.load(data.nodes);
      this.loadedEpoch = this.model.epoch;
      this.restTotal = data.total;
      this.update(); // show it now, not at the next 2 s refresh
    } catch {
      /* shown by the global error line */
    } finally {
      this.loading = false;
    }
  }

  update() {
    const m = this.model;
    if (m.seq === null || !m.index) return;
    const groups = (m.config && m.config.num_groups) || 1;
    const forest = this.tree.build(copiesFromIndex(m.index, groups));
    this.lastBuild = forest;
    const shared = forest.roots.filter((r) => r.size > 1).length;
    setText(
      this.stats,
      `${int(forest.live)} cached prefixes · ${int(forest.roots.length)} roots · ${int(shared)} with descendants`,
    );
    const items = forest.roots.slice(0, MAX_ROOTS).map((r) => this.renderNode(r, 0));
    if (forest.roots.length > MAX_ROOTS) {
      items.push(h("li", { class: "muted" }, `+${int(forest.roots.length - MAX_ROOTS)} smaller roots`));
    }
    this.root.replaceChildren(h("ul", { class: "tree" }, ...items));
  }

  /**
   * @param {import("../state/prefixtree.js").TreeNode} node
   * @param {number} depth
   * @returns {HTMLElement}
   */
  renderNode(node, depth) {
    const chain = chainFrom(node);
    const last = chain[chain.length - 1];
    const copies = chain.reduce((a, n) => a + n.copies, 0);
    const multi = chain.some((n) => n.copies > 1);
    const label = h(
      "span",
      { class: "chain", onclick: () => this.onHash(chain.map((n) => n.hash)), title: `${chain.length} blocks: ${node.hash} … ${last.hash}` },
      h("span", { class: "mono" }, shortHash(node.hash)),
      chain.length > 1 ? h("span", { class: "len" }, ` ─ ${chain.length} blocks ─ `) : " ",
      chain.length > 1 ? h("span", { class: "mono" }, shortHash(last.hash)) : "",
      multi ? h("span", { class: "tag multi", title: "some hashes are held by several blocks" }, `${copies} copies`) : "",
      node.orphan ? h("span", { class: "tag", title: "its parent was evicted" }, "orphan") : "",
      last.children.length > 1
        ? h("span", { class: "tag branch", title: `prompts diverge here: ${last.children.length} different next blocks` }, `${last.children.length}`)
        : "",
      node.size > chain.length ? h("span", { class: "muted" }, ` ${int(node.size)} in subtree`) : "",
    );
    const li = h("li", null, label);
    if (last.children.length && depth < MAX_DEPTH) {
      const kids = last.children.slice(0, MAX_CHILDREN).map((c) => this.renderNode(c, depth + 1));
      if (last.children.length > MAX_CHILDREN) {
        kids.push(h("li", { class: "muted" }, `+${last.children.length - MAX_CHILDREN} more branches`));
      }
      li.append(h("ul", null, ...kids));
    } else if (last.children.length) {
      li.append(h("ul", null, h("li", { class: "muted" }, `… ${int(last.size - 1)} deeper`)));
    }
    return li;
  }
}
