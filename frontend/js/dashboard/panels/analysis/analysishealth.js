// @ts-check
// The analysis health in the top bar: the hub's health as one item.

import { $, h, setText } from "../../../common/dom.js";
import { explain } from "../../../common/terms.js";

export class AnalysisHealthItem {
  /** @param {import("../../state/analysishub.js").AnalysisHub} hub */
  constructor(hub) {
    this.hub = hub;
    this.value = h("b", { id: "h-analysis" }, "—");
    this.item = h("span", { class: "hitem", "data-h": "analysis" }, h("i", null, "analysis"), this.value);
    $("health").append(this.item);
  }

  /** @param {number} now performance.now() */
  update(now) {
    const st = this.hub.health(now);
    setText(this.value, st.text);
    this.item.dataset.level = st.level;
    this.item.title = `${explain("analysis")}\n\n${st.title}`;
  }
}
