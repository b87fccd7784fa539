// @ts-check
// The dashboard's prefix tree: the shared PrefixTree (common/prefixtree.js)
// keyed by the 16-hex-digit hash64 the model's hash index answers for, fed
// from GET /api/prefix-tree and the stream's compact events.

import { PrefixTree as SharedTree, chainFrom } from "../../common/prefixtree.js";
import { EV_CLEARED, EV_STORED, eventHash64, parseHash64 } from "../wire/protocol.js";

export { chainFrom };

export class PrefixTree extends SharedTree {
  constructor() {
    super(eventHash64);
  }

  /**
   * Compact stream events: [seq, 0, hashes, parent, ...] | [seq, 1, hashes] | [seq, 2].
   * @param {([number, 0, string[], string | null, ...unknown[]] | [number, 1, string[], ...unknown[]] | [number, 2])[]} events
   */
  applyEvents(events) {
    for (const e of events) {
      if (e[1] === EV_STORED) this.stored(e[2], e[3]);
      else if (e[1] === EV_CLEARED) this.clear();
    }
  }
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
