// @ts-check
// The prefix-tree panel both pages draw: shared prefixes as a forest,
// single-child chains collapsed to one line ("a1b2c3d4… ─ 37 blocks ─
// 9f2c0d1e…"), branches shown where requests diverge, orphans (parent gone)
// as roots.  Built from a PrefixTree (common/prefixtree.js) and the page's
// hash map (`copies`); the page decides when to draw.

import { h, setText } from "./dom.js";
import { int, shortHash } from "./format.js";
import { chainFrom } from "./prefixtree.js";

const MAX_ROOTS = 24;
const MAX_CHILDREN = 6;
const MAX_DEPTH = 5;

export class TreeView {
  /**
   * @param {{body: HTMLElement, stats: HTMLElement, onChain: (hashes: string[]) => void, describe?: (hash: string) => string, empty?: string}} opts
   *   onChain: a chain was clicked (its hashes, root first); describe: a
   *   hash's extra text (tokens, LoRA), when the page knows more; empty: what
   *   an empty forest says (nothing by default)
   */
  constructor({ body, stats, onChain, describe, empty }) {
    this.body = body;
    this.stats = stats;
    this.onChain = onChain;
    this.describe = describe || null;
    this.empty = empty || "";
    /** @type {import("./prefixtree.js").Forest | null} the forest last drawn */
    this.lastBuild = null;
  }

  /**
   * Build the forest and draw it.
   * @param {import("./prefixtree.js").PrefixTree} tree
   * @param {(hash: string) => number} copies blocks holding a hash now
   */
  render(tree, copies) {
    const forest = tree.build(copies);
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
    if (!items.length && this.empty) items.push(h("li", { class: "muted" }, this.empty));
    this.body.replaceChildren(h("ul", { class: "tree" }, ...items));
    return forest;
  }

  /**
   * @param {import("./prefixtree.js").TreeNode} node
   * @param {number} depth
   * @returns {HTMLElement}
   */
  renderNode(node, depth) {
    const chain = chainFrom(node);
    const last = chain[chain.length - 1];
    const copies = chain.reduce((a, n) => a + n.copies, 0);
    const multi = chain.some((n) => n.copies > 1);
    const more = this.describe ? this.describe(node.hash) : "";
    const label = h(
      "span",
      { class: "chain", onclick: () => this.onChain(chain.map((n) => n.hash)), title: `${chain.length} blocks: ${node.hash} … ${last.hash}` },
      h("span", { class: "mono" }, shortHash(node.hash)),
      chain.length > 1 ? h("span", { class: "len" }, ` ─ ${chain.length} blocks ─ `) : " ",
      chain.length > 1 ? h("span", { class: "mono" }, shortHash(last.hash)) : "",
      multi ? h("span", { class: "tag multi", title: "some hashes are held by several blocks" }, `${copies} copies`) : "",
      node.orphan ? h("span", { class: "tag", title: "its parent is not held (evicted first, or stored before this view began)" }, "orphan") : "",
      last.children.length > 1
        ? h("span", { class: "tag branch", title: `prompts diverge here: ${last.children.length} different next blocks` }, `${last.children.length}`)
        : "",
      node.size > chain.length ? h("span", { class: "muted" }, ` ${int(node.size)} in subtree`) : "",
      more ? h("span", { class: "muted" }, ` ${more}`) : "",
    );
    const li = h("li", { "data-hash": node.hash }, label);
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
