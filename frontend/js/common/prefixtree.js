// @ts-check
// PrefixTree: held hashes with their parents, as a forest of shared prefixes
// -- the one both pages use.  A page loads it from REST and keeps it fresh
// from its stream's BlockStored (hash -> parent links) and AllBlocksCleared
// events; whether a hash is still held comes from the page's hash map at
// build time (`copies`), so replaying an event twice changes nothing.
// Hashes are strings; `key` turns what a page gets into the form its hash
// map answers for (the dashboard: 16 hex digits; the fleet page: as given).

/**
 * A live hash of the forest: its parent, the blocks holding it, its children
 * (largest subtree first) and its subtree's size (itself included).
 * @typedef {{hash: string, parent: string | null, copies: number, children: TreeNode[], size: number, orphan: boolean}} TreeNode
 */

/**
 * The forest of live hashes, as build() returns it.
 * @typedef {{roots: TreeNode[], nodes: Map<string, TreeNode>, live: number}} Forest
 */

export class PrefixTree {
  /** @param {(hash: string) => string} [key] a hash as this tree keeps it */
  constructor(key = (hash) => hash) {
    this.key = key;
    /** @type {Map<string, string | null>} hash -> parent hash | null */
    this.parents = new Map();
  }

  clear() {
    this.parents.clear();
  }

  /**
   * Nodes of a REST view: [{hash, parent}].
   * @param {{hash: string, parent: string | null}[]} nodes
   */
  load(nodes) {
    for (const n of nodes) {
      this.parents.set(this.key(n.hash), n.parent === null ? null : this.key(n.parent));
    }
  }

  /**
   * A BlockStored: its hashes in order, the first one's parent.
   * @param {string[]} hashes
   * @param {string | null | undefined} parent
   */
  stored(hashes, parent) {
    let p = parent === null || parent === undefined ? null : this.key(parent);
    for (const raw of hashes) {
      const h = this.key(raw);
      this.parents.set(h, p);
      p = h;
    }
  }

  /**
   * Build the forest of live hashes.  `copies(hash)` gives the number of
   * blocks holding a hash now (0: gone; the entry is dropped).
   * @param {(hash: string) => number} copies
   * @returns {Forest}
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
