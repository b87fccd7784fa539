// @ts-check
// Token usage beside block usage: slots reserved, held and the tail waste
// over the window, from the `tokens` figures in every stream frame.

import { REASON_RGB } from "../../state/analysis.js";
import { freshWindow, timeColumns } from "./analysisparts.js";
import { $, setText } from "../../../common/dom.js";
import { pct } from "../../../common/format.js";
import { MiniChart, compact } from "../../render/minichart.js";

export class TokenPanel {
  /**
   * @param {import("../../state/analysishub.js").AnalysisHub} hub
   * @param {HTMLElement} windowSel the charts' window select
   */
  constructor(hub, windowSel) {
    this.hub = hub;
    this.windowSel = windowSel;
    this.version = -1;
    this.chart = new MiniChart($("chart-tokens"), {
      height: 128,
      x: "time",
      y: { fmt: compact },
      y2: { fmt: compact, rgb: REASON_RGB.chain_broken },
      series: [
        { label: "slots reserved", rgb: [88, 166, 255], width: 1, dash: [4, 3] },
        { label: "held", rgb: [31, 111, 235], fill: 0.55 },
        { label: "tail waste", rgb: REASON_RGB.chain_broken, axis: 2, width: 1.25 },
      ],
      empty: "no token figures on the stream",
    });
    this.note = $("tokens-note");
  }

  update() {
    const t = this.hub.tokens;
    const pts = freshWindow(this, t);
    if (!pts) return;
    const { x, ys } = timeColumns(pts, ["reserved", "held", "waste"]);
    this.chart.setData(x, ys);
    const k = t.latest;
    if (k) {
      setText(
        this.note,
        `${pct(k.usage_ratio)} of ${compact(k.capacity)} slots hold tokens · reserved ${pct(k.fill_ratio)} full`,
      );
      this.note.dataset.held = String(k.held);
      this.note.dataset.reserved = String(k.slots_reserved);
    }
  }
}
