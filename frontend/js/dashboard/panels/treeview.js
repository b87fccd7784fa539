// @ts-check
// The dashboard's prefix-tree panel: the shared TreeView (common/treeview.js)
// over the PrefixTree (REST + events), liveness from the model's hash index.

import { get } from "../../common/api.js";
import { $ } from "../../common/dom.js";
import { TreeView } from "../../common/treeview.js";
import { copiesFromIndex } from "../state/prefixtree.js";

export class TreePanel {
  /**
   * @param {import("../state/model.js").PoolModel} model
   * @param {import("../state/prefixtree.js").PrefixTree} tree
   * @param {(hexes: string[]) => void} onHash highlight the blocks of these hashes
   */
  constructor(model, tree, onHash) {
    this.model = model;
    this.tree = tree;
    this.view = new TreeView({ body: $("tree-body"), stats: $("tree-stats"), onChain: onHash });
    this.loading = false;
    this.loadedEpoch = null;
  }

  /** @returns {import("../../common/prefixtree.js").Forest | null} the forest last drawn */
  get lastBuild() {
    return this.view.lastBuild;
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
    this.view.render(this.tree, copiesFromIndex(m.index, groups));
  }
}
