// @ts-check
// Events per second per instance (uPlot, vendored), from the stream's ticks.

import { clockText } from "../common/format.js";
import { clockHalf, timeRange } from "../common/timeaxis.js";

const POINTS = 150;
// the axes' font, named so the room for the last clock label is measured in it
const AXIS_FONT = "12px system-ui, sans-serif";

/**
 * An axis tick in three or four characters (12k, 1.5M): never cut to ",000".
 * @param {number | null | undefined} v
 */
export function tickText(v) {
  if (v === null || v === undefined || !Number.isFinite(v)) return "";
  const a = Math.abs(v);
  if (a >= 1e6) return `${Number((v / 1e6).toPrecision(3))}M`;
  if (a >= 1e3) return `${Number((v / 1e3).toPrecision(3))}k`;
  return String(Number(v.toPrecision(3)));
}


export class RateChart {
  /** @param {HTMLElement} container */
  constructor(container) {
    this.container = container;
    /** @type {import("../../vendor/uplot/uPlot") | null} the chart, once there are instances */
    this.plot = null;
    /** @type {string[]} the instances charted, in series order */
    this.names = [];
    /** @type {number[]} tick times (unix s) */
    this.xs = [];
    /** @type {number[][]} events/s per instance, per tick */
    this.ys = [];
    /** @type {{ts: number, counts: number[]} | null} the previous tick */
    this.prev = null;
  }

  /**
   * One tick: each instance's cumulative event count at `ts`.
   * @param {number} ts
   * @param {{name: string, events: number}[]} instances
   */
  update(ts, instances) {
    if (typeof uPlot === "undefined") return;
    const names = instances.map((i) => i.name);
    const plot = this.plot && names.join("\n") === this.names.join("\n") ? this.plot : this.build(names);
    const counts = instances.map((i) => i.events);
    const prev = this.prev;
    if (prev) {
      const dt = Math.max(ts - prev.ts, 1e-3);
      this.xs.push(ts);
      counts.forEach((c, k) => this.ys[k].push(Math.max(0, (c - prev.counts[k]) / dt)));
      if (this.xs.length > POINTS) {
        this.xs.shift();
        this.ys.forEach((y) => y.shift());
      }
      // the x range set here, not by uPlot: it widens a lone point to a thousand days
      plot.setData([this.xs, ...this.ys], false);
      const [min, max] = timeRange(this.xs[0], this.xs[this.xs.length - 1]);
      plot.setScale("x", { min, max });
    }
    this.prev = { ts, counts };
  }

  /**
   * A new chart for these instances (the old one goes): returns it.
   * @param {string[]} names
   */
  build(names) {
    if (this.plot) this.plot.destroy();
    this.names = names;
    this.xs = [];
    this.ys = names.map(() => []);
    this.prev = null;
    const colors = ["#58a6ff", "#3fb950", "#f0883e", "#db61a2", "#e3b341", "#a371f7", "#56d4dd", "#f85149"];
    const width = Math.max(200, this.container.clientWidth || 280);
    this.plot = new uPlot(
      {
        width,
        height: 120,
        legend: { show: true },
        // room on the right for half of the last clock label (centred on the plot's edge)
        padding: [8, () => clockHalf(AXIS_FONT) + 2, 0, 0],
        scales: { x: { time: true, auto: false } },
        axes: [
          { stroke: "#8b949e", grid: { stroke: "#2a313c" }, font: AXIS_FONT, space: 70, values: (u, vals) => vals.map((v) => clockText(v)) },
          { stroke: "#8b949e", grid: { stroke: "#2a313c" }, font: AXIS_FONT, size: 44, values: (u, vals) => vals.map(tickText) },
        ],
        series: [{}, ...names.map((n, k) => ({ label: n, stroke: colors[k % colors.length], width: 1 }))],
      },
      [[], ...names.map(() => [])],
      this.container,
    );
    return this.plot;
  }
}
