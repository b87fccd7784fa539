// @ts-check
// Token usage beside block usage: slots reserved, held and the tail waste
// over the window, from the `tokens` figures in every stream frame.  Where
// the server cannot know the tokens (a mirror: the engine tells blocks, never
// tokens) held, tail waste and the fill are "not known", with the reason on
// hover, and only the slots reserved are drawn.

import { REASON_RGB } from "../../state/missreasons.js";
import { freshWindow, timeColumns } from "./analysisparts.js";
import { $, setText } from "../../../common/dom.js";
import { compact, pct } from "../../../common/format.js";
import { MiniChart } from "../../render/minichart.js";
import { MIRROR_WHY, onMirror, unknownTitle } from "../unknown.js";

/**
 * Why the token figures are not known (null: they are): the server's
 * `reason`, a null `held`, or a mirror whose server sends no reason at all
 * (an older one: its held and tail waste are defaults, not the engine's).
 * @param {import("../../state/analysis.js").TokenUsage} k
 */
export function tokensUnknown(k) {
  if (k.reason) return k.reason;
  if (k.held === null || k.held === undefined) return MIRROR_WHY.tokens;
  if (onMirror() && !("reason" in k)) return MIRROR_WHY.tokens;
  return null;
}

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
    const k = t.latest;
    const why = k ? tokensUnknown(k) : null;
    if (why) {
      // not known: no line drawn for them (never a default 0 or held = reserved)
      ys[1] = ys[1].map(() => null);
      ys[2] = ys[2].map(() => null);
    }
    this.chart.o.series[1].unknown = why;
    this.chart.o.series[2].unknown = why;
    this.chart.setData(x, ys);
    if (k) {
      if (why) {
        setText(this.note, `${compact(k.slots_reserved)} of ${compact(k.capacity)} slots reserved · tokens held, tail waste: ${onMirror() ? "not known on a mirror" : "not known"}`);
        this.note.title = unknownTitle(why);
        this.note.dataset.unknown = why;
      } else {
        setText(this.note, `${pct(k.usage_ratio)} of ${compact(k.capacity)} slots hold tokens · reserved ${pct(k.fill_ratio)} full`);
        this.note.title = "";
        delete this.note.dataset.unknown;
      }
      this.note.dataset.held = String(k.held);
      this.note.dataset.reserved = String(k.slots_reserved);
    }
  }
}
