// @ts-check
// What the charts' scales show, shared by the live charts (charts.js) and the
// analysis row's small ones (minichart.js): the axes' style (colour, grid,
// font), their tick steps, the room a label needs (labels never touch), the
// ranges of x and y, and the columns uPlot plots (stacked series as running
// sums). No drawing here: uPlot draws.

import { textWidth } from "../../common/textwidth.js";

/**
 * One series of a chart (MiniChart's).
 * @typedef {object} SeriesSpec
 * @property {string} label
 * @property {import("../../common/palette.js").RGB} rgb
 * @property {number} [fill] the alpha of the fill under it
 * @property {number} [width]
 * @property {boolean} [stack] stacked on the stacked series before it
 * @property {number} [axis] 2: the right-hand axis
 * @property {boolean} [bars]
 * @property {boolean} [points] its points drawn
 * @property {number[]} [dash]
 * @property {boolean} [spanGaps]
 * @property {(v: number) => string} [fmt] its legend value
 * @property {string} [help] its legend's hover text (else the glossary's for its label)
 * @property {string | null} [unknown] why the series is not known (its legend says "not known", the reason on hover)
 */

/**
 * A y axis of a chart (MiniChart's).
 * @typedef {object} AxisSpec
 * @property {(v: number) => string} [fmt]
 * @property {(lo: number, hi: number) => [number, number]} [range]
 * @property {import("../../common/palette.js").RGB} [rgb]
 */

/**
 * A point drawn over a chart (a ring and its label) on axis 1 or 2.
 * @typedef {{x: number, y: number, rgb?: import("../../common/palette.js").RGB, label?: string, axis?: number}} ChartMark
 */

export const AXIS_STROKE = "#8b949e";
export const GRID = { stroke: "rgba(139,148,158,0.12)", width: 1 };
export const FONT = "11px ui-sans-serif, system-ui, sans-serif";
export const TIME_INCRS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600];
export const CAT_INCRS = [1, 2, 3, 4, 5, 10, 20, 50, 100];
// y ticks at 1, 2, 5 × 10^k (counts: whole numbers only)
/** @type {number[]} */
export const Y_INCRS = [];
for (let e = -4; e <= 9; e++) for (const m of [1, 2, 5]) Y_INCRS.push(Number((m * 10 ** e).toPrecision(1)));
export const INT_INCRS = Y_INCRS.filter((v) => v >= 1);
// px between y ticks: at least 2 or 3 ticks on the smallest plots (the
// histograms are ~40 px tall)
export const ySpace = (/** @type {number} */ dim) => Math.min(24, Math.max(12, dim / 3));

/**
 * The widest of `labels` in px, drawn in the charts' axis font (0 without a DOM).
 * @param {unknown[]} labels
 */
export function labelWidth(labels, font = FONT) {
  return textWidth(labels, font);
}

/**
 * A y axis's size (uPlot's `size`): `least` px, or more when its widest
 * label needs it beside the axis's ticks and gap -- a count of 100 on a
 * histogram's narrow axis.
 * @param {number} least
 * @returns {(u: import("../../../vendor/uplot/uPlot"), values: string[], i: number) => number}
 */
export function fitSize(least) {
  return (u, values, i) => {
    const ax = u.axes[i];
    const beside = ((ax.ticks && ax.ticks.size) || 0) + (ax.gap || 0);
    return Math.max(least, labelWidth(values || []) + beside + 1);
  };
}

/**
 * Which axis labels to draw so that none touches another nor passes the
 * canvas: centred at px[i], widths[i] wide, kept left to right while at
 * least `gap` px clear of the last one kept and wholly inside lo..hi (an
 * empty label, or one that would pass an edge, is never kept and never
 * blocks).
 * @param {number[]} px
 * @param {number[]} widths
 */
export function keepApart(px, widths, gap = 6, lo = -Infinity, hi = Infinity) {
  const keep = px.map(() => false);
  let right = -Infinity;
  for (let i = 0; i < px.length; i++) {
    if (!widths[i] || !Number.isFinite(px[i])) continue;
    const left = px[i] - widths[i] / 2;
    const end = px[i] + widths[i] / 2;
    if (left < lo || end > hi) continue;
    if (left >= right + gap) {
      keep[i] = true;
      right = end;
    }
  }
  return keep;
}

/**
 * uPlot axis filter: leave out the x labels that would collide (label(v) their
 * text) or be cut by the canvas's edges -- a category histogram's last label
 * centred half a narrow slot from the right edge.  Positions are the plot's
 * (CSS px from its left); the canvas runs from -bbox.left to width - bbox.left.
 * @param {(v: number) => string} label
 * @returns {import("../../../vendor/uplot/uPlot").Axis.Filter}
 */
export function apartFilter(label, font = FONT) {
  return (u, splits) => {
    const texts = splits.map((v) => (v === null || v === undefined ? "" : label(v)));
    const px = splits.map((v) => (v === null || v === undefined ? NaN : u.valToPos(v, "x")));
    const ratio = /** @type {{ pxRatio?: number }} */ (/** @type {unknown} */ (u)).pxRatio || 1;
    const left = u.bbox.left / ratio;
    const widths = texts.map((t) => (t ? labelWidth([t], font) : 0));
    const keep = keepApart(px, widths, 6, -left, u.width - left);
    return splits.map((v, i) => (keep[i] ? v : null));
  };
}

/**
 * @param {number | null | undefined} v
 * @returns {v is number}
 */
const finite = (v) => v !== null && v !== undefined && Number.isFinite(v);

/**
 * A y scale's top for data up to hi on a plot dim px tall: a multiple of the
 * tick step uPlot will choose (the smallest of incrs at least ySpace(dim)
 * px apart), so that the top line has its label.
 * @param {number} hi
 * @param {number} dim
 */
export function niceTop(hi, dim, incrs = Y_INCRS) {
  if (!(hi > 0)) hi = 1;
  const space = ySpace(dim);
  for (const incr of incrs) {
    const top = Math.ceil(hi / incr - 1e-9) * incr;
    if ((dim * incr) / top >= space) return Number(top.toPrecision(12));
  }
  return hi;
}

/**
 * uPlot's data from the chart's columns: x (category charts: the indices),
 * then one column per series, stacked series as running sums (a gap leaves
 * the sum below it unchanged).
 * @param {{x?: string, series: SeriesSpec[]}} o
 * @param {number[]} x
 * @param {(number | null | undefined)[][]} ys
 * @returns {[number[], ...(number | null)[][]]}
 */
export function plotData(o, x, ys) {
  const n = x.length;
  /** @type {[number[], ...(number | null)[][]]} */
  const out = [o.x === "cat" ? x.map((_, i) => i) : x.slice()];
  const base = new Array(n).fill(0);
  o.series.forEach((s, k) => {
    const col = ys[k] || [];
    if (!s.stack) {
      out.push(Array.from({ length: n }, (_, i) => (finite(col[i]) ? col[i] : null)));
      return;
    }
    const top = new Array(n);
    for (let i = 0; i < n; i++) {
      top[i] = finite(col[i]) ? base[i] + col[i] : null;
      if (top[i] !== null) base[i] = top[i];
    }
    out.push(top);
  });
  return out;
}

/**
 * uPlot bands between consecutive stacked series (upper, lower: 1-based).
 * @param {{stack?: boolean}[]} series
 */
export function stackBands(series) {
  /** @type {{series: [number, number]}[]} */
  const bands = [];
  let below = -1;
  series.forEach((s, k) => {
    if (!s.stack) return;
    if (below >= 0) bands.push({ series: [k + 1, below + 1] });
    below = k;
  });
  return bands;
}

/**
 * A y scale's range: data and marks on that axis, then the axis's own
 * `range`, or 0 to a round top (niceTop on a plot dim px tall).
 * @param {AxisSpec | undefined} spec
 * @param {number | null | undefined} lo
 * @param {number | null | undefined} hi
 * @param {{marks?: ChartMark[], axis?: number, dim?: number, incrs?: number[]}} [opts]
 * @returns {[number, number]}
 */
export function yRange(spec, lo, hi, opts = {}) {
  const { marks = [], axis = 1, dim = 80, incrs = Y_INCRS } = opts;
  for (const m of marks) {
    if ((m.axis || 1) === axis && finite(m.y)) {
      lo = finite(lo) ? Math.min(lo, m.y) : m.y;
      hi = finite(hi) ? Math.max(hi, m.y) : m.y;
    }
  }
  if (!finite(lo) || !finite(hi)) {
    lo = 0;
    hi = 1;
  }
  if (spec && spec.range) return spec.range(lo, hi);
  return [Math.min(0, lo), niceTop(hi, dim, incrs)];
}

/**
 * The x scale's range: the data's span (log2 curves padded a little on each side).
 * @param {{x?: string, xLog2?: boolean}} o
 * @param {number[]} x
 * @returns {[number, number]}
 */
export function xRange(o, x) {
  if (o.x === "cat") return [-0.5, Math.max(0.5, x.length - 0.5)];
  if (!x.length) return o.xLog2 ? [0.5, 2] : [0, 1];
  const lo = x[0];
  const hi = x[x.length - 1];
  if (o.xLog2) {
    const pad = 2 ** Math.max(0.25, Math.log2(hi / lo) * 0.08);
    return [lo / pad, hi * pad];
  }
  return hi === lo ? [lo - 1, hi + 1] : [lo, hi];
}
