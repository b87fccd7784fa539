// @ts-check
// PrefixTree: cached hashes with their parents, as a forest of shared
// prefixes.  Loaded from GET /api/prefix-tree, kept fresh from the stream's
// BlockStored (hash -> parent links) and AllBlocksCleared events.  Whether a
// hash is still cached comes from the model's hash index (exact, from the
// columns), so replaying an event twice changes nothing.

import { EV_CLEARED, EV_STORED, eventHash64, parseHash64 } from "../wire/protocol.js";

/**
 * A live hash of the forest: its parent, the blocks holding it, its children
 * (largest subtree first) and its subtree's size (itself included).
 * @typedef {{hash: string, parent: string | null, copies: number, children: TreeNode[], size: number, orphan: boolean}} TreeNode
 */

export class PrefixTree {
  constructor() {
    /** @type {Map<string, string | null>} hex16 -> parent hex16 | null */
    this.parents = new Map();
  }

  clear() {
    this.parents.clear();
  }

  /**
   * Nodes of GET /api/prefix-tree: [{hash, parent, block_ids}].
   * @param {{hash: string, parent: string | null}[]} nodes
   */
  load(nodes) {
    for (const n of nodes) {
      this.parents.set(eventHash64(n.hash), n.parent === null ? null : eventHash64(n.parent));
    }
  }

  /**
   * Compact stream events: [seq, 0, hashes, parent, ...] | [seq, 1, hashes] | [seq, 2].
   * @param {([number, 0, string[], string | null, ...unknown[]] | [number, 1, string[], ...unknown[]] | [number, 2])[]} events
   */
  applyEvents(events) {
    for (const e of events) {
      if (e[1] === EV_STORED) {
        let parent = e[3] === null || e[3] === undefined ? null : eventHash64(e[3]);
        for (const raw of e[2]) {
          const h = eventHash64(raw);
          this.parents.set(h, parent);
          parent = h;
        }
      } else if (e[1] === EV_CLEARED) {
        this.parents.clear();
      }
    }
  }

  /**
   * Build the forest of live hashes.  `copies(hex)` gives the number of
   * blocks holding a hash now (0: evicted; the entry is dropped).
   * Returns {roots, nodes: Map hex -> node, live} where a node is
   * {hash, parent, copies, children: [node], size (nodes in its subtree)}.
   * @param {(hex: string) => number} copies
   */
  build(copies) {
    /** @type {Map<string, TreeNode>} */
    const nodes = new Map();
    for (const [h, parent] of this.parents) {
      const c = copies(h);
      if (c <= 0) {
        this.parents.delete(h);
        continue;
      }
      nodes.set(h, { hash: h, parent, copies: c, children: [], size: 1, orphan: false });
    }
    /** @type {TreeNode[]} */
    const roots = [];
    for (const node of nodes.values()) {
      const p = node.parent === null ? undefined : nodes.get(node.parent);
      if (p) p.children.push(node);
      else {
        node.orphan = node.parent !== null; // its parent was evicted
        roots.push(node);
      }
    }
    // subtree sizes, iteratively (chains can be thousands deep)
    /** @type {TreeNode[]} */
    const order = [];
    const stack = roots.slice();
    for (let n = stack.pop(); n; n = stack.pop()) {
      order.push(n);
      for (const c of n.children) stack.push(c);
    }
    for (let i = order.length - 1; i >= 0; i--) {
      const n = order[i];
      for (const c of n.children) n.size += c.size;
      n.children.sort((a, b) => b.size - a.size);
    }
    roots.sort((a, b) => b.size - a.size);
    return { roots, nodes, live: nodes.size };
  }

  /**
   * The root of a hash's chain (walking parents while known), or the hash itself.
   * @param {string} h
   */
  rootOf(h) {
    let cur = h;
    for (let i = 0; i < 100000; i++) {
      const p = this.parents.get(cur);
      if (p === null || p === undefined || !this.parents.has(p)) return cur;
      cur = p;
    }
    return cur;
  }
}

/**
 * Collapse a node's single-child chain: [first, ..., last] where every node
 * but the last has exactly one child.
 * @param {TreeNode} node
 */
export function chainFrom(node) {
  const chain = [node];
  let cur = node;
  while (cur.children.length === 1) {
    cur = cur.children[0];
    chain.push(cur);
  }
  return chain;
}

/**
 * copies(hex) for build(): blocks under a hash in any group of the index.
 * @param {import("./hashindex.js").HashIndex} index
 * @param {number} numGroups
 * @returns {(hex: string) => number}
 */
export function copiesFromIndex(index, numGroups) {
  return (hex) => {
    const p = parseHash64(hex);
    if (!p) return 0;
    let c = 0;
    for (let g = 0; g < numGroups; g++) {
      const s = index.find(p[0], p[1], g);
      if (s >= 0) c += index.count[s];
    }
    return c;
  };
}
