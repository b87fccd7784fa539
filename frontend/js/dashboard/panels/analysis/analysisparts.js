// @ts-check
// What the analysis panels share: the quiet REST getter, a few formatters,
// the colour swatch, the window of a series that moved, and the small bar
// histogram (MissPanel's age and queue position, RegretPanel's gap).
//
// REST views are fetched quietly: a failure shows in its panel, not in the
// page's error line.

import { trimHistogram } from "../../state/analysis.js";
import { api } from "../../../common/api.js";
import { h } from "../../../common/dom.js";
import { compact, durTick } from "../../../common/format.js";
import { rgba } from "../../../common/palette.js";
import { MiniChart } from "../../render/minichart.js";

export const quiet = (path) => api("GET", path, undefined, { quiet: true });
const boundLabel = (b, unit) => (b === "+Inf" ? "more" : unit === "s" ? `≤${durTick(b)}` : `≤${compact(b)}`);

export function swatch(rgb) {
  return h("i", { class: "sw-dot", style: `background:${rgba(rgb)}` });
}

/**
 * The points of `series` over the panel's window (its `windowSel`, 120 s
 * by default), or null when the series has not moved since the panel last
 * looked (the panel's `version`, which this advances).
 */
export function freshWindow(panel, series) {
  if (series.version === panel.version) return null;
  panel.version = series.version;
  return series.window(Number(panel.windowSel.value) || 120);
}

/** Chart columns for a time chart: the points' ts, then one column per key. */
export function timeColumns(pts, keys) {
  return { x: pts.map((p) => p.ts), ys: keys.map((k) => pts.map((p) => p[k])) };
}

/** A small bar histogram (MiniChart: uPlot bars) over trimmed buckets. */
export function histChart(el, rgb, unit, height = 64) {
  const chart = new MiniChart(el, {
    height,
    x: "cat",
    legend: false,
    yWidth: 30,
    empty: "none yet",
    xFmt: (b) => boundLabel(b, unit),
    series: [{ label: "count", rgb, bars: true, fill: 0.75 }],
  });
  return {
    chart,
    key: "",
    set(hg) {
      const key = hg ? `${hg.count}/${hg.sum}` : "";
      if (key === this.key) return;
      this.key = key;
      if (!hg || !hg.count) {
        chart.setData([], [[]]);
        return;
      }
      const t = trimHistogram(hg);
      chart.setData(t.bounds, [t.counts]);
    },
  };
}
