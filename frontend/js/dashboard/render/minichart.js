// @ts-check
// MiniChart: the analysis row's small charts, drawn by uPlot (vendored, the
// library of the charts above them) in the same style: axis colour, grid,
// 11 px font. A thin adapter: time series (stacked areas or lines, on one or
// two y axes), bar histograms over categories, an x-y curve on a log2 x
// scale with marked points. uPlot draws on setData and on resize only, never
// per animation frame; a small legend line under the chart shows the values
// at the cursor (or the latest), and a note covers the plot while there is
// no data.

import { context2d } from "../../common/dom.js";
import { explain } from "../../common/terms.js";
import { markMoment } from "./moment.js";

const uPlotLib = () => globalThis.uPlot;

/**
 * uPlot's bar path builder: the vendored full build has it (its .d.ts marks
 * every builder optional).
 * @param {import("../../../vendor/uplot/uPlot").Series.BarsPathBuilderOpts} opts
 */
export function barPaths(opts) {
  const bars = uPlotLib().paths.bars;
  if (!bars) throw new Error("this uPlot build has no bar paths");
  return bars(opts);
}

/**
 * One series of a MiniChart.
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
 * A y axis of a MiniChart.
 * @typedef {object} AxisSpec
 * @property {(v: number) => string} [fmt]
 * @property {(lo: number, hi: number) => [number, number]} [range]
 * @property {import("../../common/palette.js").RGB} [rgb]
 */

/**
 * A MiniChart's options (see the class).
 * @typedef {object} MiniChartOpts
 * @property {number} [height]
 * @property {string} [x] "time" | "num" | "cat"
 * @property {boolean} [xLog2]
 * @property {(v: number, i?: number) => string} [xFmt]
 * @property {number[]} [xTicks]
 * @property {number} [yWidth]
 * @property {AxisSpec} [y]
 * @property {AxisSpec} [y2]
 * @property {number} [y2Width]
 * @property {SeriesSpec[]} series
 * @property {boolean} [legend]
 * @property {(xs: number[]) => number} [legendIdx]
 * @property {string} [empty]
 * @property {(idx: number | null) => void} [onhover]
 */

/**
 * A point drawn over a chart (a ring and its label) on axis 1 or 2.
 * @typedef {{x: number, y: number, rgb?: import("../../common/palette.js").RGB, label?: string, axis?: number}} ChartMark
 */

const AXIS = "#8b949e";
const GRID = { stroke: "rgba(139,148,158,0.12)", width: 1 };
const FONT = "11px ui-sans-serif, system-ui, sans-serif";
const TIME_INCRS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600];
const CAT_INCRS = [1, 2, 3, 4, 5, 10, 20, 50, 100];
// y ticks at 1, 2, 5 × 10^k (counts: whole numbers only)
/** @type {number[]} */
const Y_INCRS = [];
for (let e = -4; e <= 9; e++) for (const m of [1, 2, 5]) Y_INCRS.push(Number((m * 10 ** e).toPrecision(1)));
const INT_INCRS = Y_INCRS.filter((v) => v >= 1);
// px between y ticks: at least 2 or 3 ticks on the smallest plots (the
// histograms are ~40 px tall)
const ySpace = (/** @type {number} */ dim) => Math.min(24, Math.max(12, dim / 3));

/** @type {CanvasRenderingContext2D | null} */
let measurer = null;
/**
 * The widest of `labels` in px, drawn in the charts' axis font (0 without a DOM).
 * @param {unknown[]} labels
 */
export function labelWidth(labels, font = FONT) {
  if (!measurer) {
    if (typeof document === "undefined") return 0;
    measurer = context2d(document.createElement("canvas"));
  }
  measurer.font = font;
  let w = 0;
  for (const t of labels) if (t) w = Math.max(w, measurer.measureText(String(t)).width);
  return Math.ceil(w);
}

/**
 * Which axis labels to draw so that none touches another: centred at px[i],
 * widths[i] wide, kept left to right while at least `gap` px clear of the
 * last one kept (an empty label is never kept and never blocks).
 * @param {number[]} px
 * @param {number[]} widths
 */
export function keepApart(px, widths, gap = 6) {
  const keep = px.map(() => false);
  let right = -Infinity;
  for (let i = 0; i < px.length; i++) {
    if (!widths[i] || !Number.isFinite(px[i])) continue;
    const left = px[i] - widths[i] / 2;
    if (left >= right + gap) {
      keep[i] = true;
      right = px[i] + widths[i] / 2;
    }
  }
  return keep;
}

/**
 * uPlot axis filter: leave out the x labels that would collide (label(v) their text).
 * @param {(v: number) => string} label
 * @returns {import("../../../vendor/uplot/uPlot").Axis.Filter}
 */
export function apartFilter(label, font = FONT) {
  return (u, splits) => {
    const texts = splits.map((v) => (v === null || v === undefined ? "" : label(v)));
    const px = splits.map((v) => (v === null || v === undefined ? NaN : u.valToPos(v, "x")));
    const keep = keepApart(px, texts.map((t) => (t ? labelWidth([t], font) : 0)));
    return splits.map((v, i) => (keep[i] ? v : null));
  };
}

/** @param {import("../../common/palette.js").RGB} rgb @param {number} [a] */
export const rgba = ([r, g, b], a = 1) => `rgba(${r}, ${g}, ${b}, ${a})`;

export const hms = (/** @type {number} */ t) => {
  const d = new Date(t * 1000);
  return `${String(d.getHours()).padStart(2, "0")}:${String(d.getMinutes()).padStart(2, "0")}:${String(d.getSeconds()).padStart(2, "0")}`;
};

export const compact = (/** @type {number | null | undefined} */ v) => {
  if (v === null || v === undefined || !Number.isFinite(v)) return "—";
  const a = Math.abs(v);
  if (a >= 1e6) return `${(v / 1e6).toFixed(1)}M`;
  if (a >= 1e4) return `${Math.round(v / 1e3)}k`;
  if (a >= 1e3) return `${(v / 1e3).toFixed(1)}k`;
  if (a >= 10 || v === Math.round(v)) return String(Math.round(v));
  return v.toFixed(1);
};

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

/**
 * new MiniChart(el, {
 *   height, x: "time" | "num" | "cat", xLog2, xFmt(v), xTicks: [values],
 *   yWidth, y: {fmt, range(lo, hi) -> [a, b]}, y2: {fmt, range, rgb}, y2Width,
 *   series: [{label, rgb, fill (alpha), width, stack, axis: 2, bars, points, dash, spanGaps, fmt}],
 *   legend: true, legendIdx(xs) -> the index shown without a cursor (default: the last),
 *   empty: "text when there is no data", onhover(idx | null)
 * })
 * chart.u is the uPlot instance; chart.x / ys / marks the data last set.
 */
export class MiniChart {
  /**
   * @param {HTMLElement} el
   * @param {MiniChartOpts} opts
   */
  constructor(el, opts) {
    this.el = el;
    this.o = { height: 110, x: "time", legend: true, ...opts };
    /** @type {number[]} */
    this.x = [];
    /** @type {(number | null | undefined)[][]} */
    this.ys = [];
    /** @type {ChartMark[]} */
    this.marks = [];
    /** @type {number | null} the data index under the cursor */
    this.hover = null;
    /** @type {string | null} */
    this.loadingText = null;
    this.draws = 0;
    el.classList.add("minichart");
    this.u = new (uPlotLib())(this._opts(), plotData(this.o, [], []), el);
    this.emptyEl = document.createElement("div");
    this.emptyEl.className = "mc-empty";
    this.u.over.append(this.emptyEl);
    /** @type {HTMLElement[]} the legend's value per series (set by _makeLegend) */
    this.items = [];
    this.legend = this.o.legend ? this._makeLegend() : null;
    this._showEmpty();
    this._legend(null);
    this.W = this._width();
    this.ro = new ResizeObserver(() => {
      const w = this._width();
      if (w === this.W) return;
      this.W = w;
      this.u.setSize({ width: w, height: this.o.height });
    });
    this.ro.observe(el);
  }

  /**
   * xs and one array per series (null = no value / a gap), and the marks.
   * @param {number[]} x
   * @param {(number | null | undefined)[][]} ys
   * @param {ChartMark[]} [marks]
   */
  setData(x, ys, marks = []) {
    this.x = x;
    this.ys = ys;
    this.marks = marks;
    if (this.hover !== null && this.hover >= x.length) this.hover = null;
    this.u.setData(plotData(this.o, x, ys));
    this._showEmpty();
    this._legend(this.hover);
  }

  get lastIndex() {
    return this.x.length - 1;
  }

  destroy() {
    this.ro.disconnect();
    this.u.destroy();
    if (this.legend) this.legend.remove();
  }

  /** The plot's height in CSS px (before uPlot's first layout: the chart's less its x axis). */
  _plotHeight(u) {
    const h = u && u.bbox && u.bbox.height ? u.bbox.height / (u.pxRatio || 1) : 0;
    return h > 0 ? h : this.o.height - 24;
  }

  _width() {
    return Math.max(80, Math.floor(this.el.clientWidth));
  }

  // ------------------------------------------------------ uPlot options

  /** @returns {import("../../../vendor/uplot/uPlot").Options} */
  _opts() {
    const o = this.o;
    const axis = { stroke: AXIS, grid: GRID, ticks: { show: false }, font: FONT };
    const bars = o.series.some((s) => s.bars);
    const xFmt = o.xFmt || String;
    const yIncrs = bars ? INT_INCRS : Y_INCRS;
    let xAxis;
    if (o.x === "time") {
      // a time label whose text would pass the plot's right edge (into the
      // second y axis or out of the chart), or reach under the y axis's
      // bottom label, is left out
      const room = o.y2 ? 26 : 16;
      xAxis = {
        space: 64,
        incrs: TIME_INCRS,
        filter: (u, splits) => {
          const { min, max } = u.scales.x;
          const w = u.bbox.width / (u.pxRatio || 1);
          const px = (v) => ((v - min) / (max - min)) * w;
          return splits.map((v) => (max > min && (px(v) < 20 || w - px(v) < room) ? null : v));
        },
        values: (u, vals) => vals.map((v) => (this.x.length && v !== null ? hms(v) : "")),
      };
    } else if (o.x === "cat") {
      // categories one label apart at least (the widest label, measured)
      const catLabel = (i) => (Number.isInteger(i) && i >= 0 && i < this.x.length ? xFmt(this.x[i], i) : "");
      xAxis = {
        space: () => Math.max(24, labelWidth(this.x.map((v, i) => xFmt(v, i))) + 8),
        incrs: CAT_INCRS,
        filter: apartFilter(catLabel),
        values: (u, vals) => vals.map((i) => (i === null ? "" : catLabel(i))),
      };
    } else {
      xAxis = {
        space: 24,
        splits: (u) => (o.xTicks || this.x).filter((v) => v >= u.scales.x.min && v <= u.scales.x.max),
        filter: apartFilter((v) => xFmt(v)),
        values: (u, vals) => vals.map((v) => (v === null ? "" : xFmt(v))),
      };
    }
    /** @type {import("../../../vendor/uplot/uPlot").Axis[]} */
    const axes = [
      { ...axis, ...xAxis, size: 18, gap: 3 },
      { ...axis, scale: "y", size: o.yWidth || 38, gap: 4, space: (u, i, min, max, dim) => ySpace(dim), incrs: yIncrs, values: (u, vals) => vals.map((v) => ((o.y && o.y.fmt) || compact)(v)) },
    ];
    /** @type {import("../../../vendor/uplot/uPlot").Scales} */
    const scales = {
      x: o.x === "time" ? { time: true } : { time: false, ...(o.xLog2 ? { distr: 3, log: 2 } : {}) },
      y: { range: (u, lo, hi) => yRange(o.y, lo, hi, { marks: this.marks, axis: 1, dim: this._plotHeight(u), incrs: yIncrs }) },
    };
    scales.x.range = () => xRange(o, this.x);
    const y2 = o.y2;
    if (y2) {
      const c = y2.rgb ? rgba(y2.rgb) : AXIS;
      axes.push({ ...axis, scale: "y2", side: 1, stroke: c, grid: { show: false }, size: o.y2Width || 38, gap: 4, space: (u, i, min, max, dim) => ySpace(dim), incrs: Y_INCRS, values: (u, vals) => vals.map((v) => (y2.fmt || compact)(v)) });
      scales.y2 = { range: (u, lo, hi) => yRange(y2, lo, hi, { marks: this.marks, axis: 2, dim: this._plotHeight(u) }) };
    }
    const barPath = bars ? barPaths({ size: [0.8, 40], gap: 1 }) : null;
    const series = [
      {},
      ...o.series.map((s) => {
        const stroke = rgba(s.rgb);
        const out = { label: s.label, scale: s.axis === 2 ? "y2" : "y", stroke, spanGaps: !!s.spanGaps };
        if (s.bars) {
          return { ...out, width: 1, fill: rgba(s.rgb, s.fill ?? 0.7), paths: barPath, points: { show: false } };
        }
        out.width = s.width ?? (s.stack || s.fill ? 1 : 1.25);
        if (s.stack || s.fill) out.fill = rgba(s.rgb, s.fill ?? 0.55);
        if (s.dash) out.dash = s.dash;
        // points: on a curve of a few values, or where a series has one value
        out.points = { show: (u, si, i0, i1) => !!s.points || i1 === i0, size: 6, width: 1, fill: stroke, stroke };
        return out;
      }),
    ];
    return {
      width: this._width(),
      height: o.height,
      padding: [6, o.y2 ? 0 : 10, 0, 0],
      legend: { show: false },
      cursor: { drag: { x: false, y: false, setScale: false }, points: { show: !bars }, y: false },
      axes,
      scales,
      series,
      bands: stackBands(o.series),
      hooks: {
        draw: [(u) => this._drawn(u)],
        setCursor: [(u) => this._cursor(u.cursor.idx)],
      },
    };
  }

  // --------------------------------------------------------- callbacks

  /** After each uPlot draw: the marks (a ring and its label) over the series. */
  _drawn(u) {
    this.draws++;
    if (!this.x.length || !this.marks.length) return;
    const uPlot = uPlotLib();
    const pr = u.pxRatio || uPlot.pxRatio || 1;
    const ctx = u.ctx;
    const { left, top, width, height } = u.bbox;
    ctx.save();
    ctx.font = `${11 * pr}px ui-sans-serif, system-ui, sans-serif`;
    for (const m of this.marks) {
      const x = u.valToPos(m.x, "x", true);
      const y = u.valToPos(m.y, (m.axis || 1) === 2 ? "y2" : "y", true);
      const color = m.rgb ? rgba(m.rgb) : "#e6edf3";
      ctx.strokeStyle = color;
      ctx.lineWidth = 2 * pr;
      ctx.beginPath();
      ctx.arc(x, y, 6 * pr, 0, Math.PI * 2);
      ctx.stroke();
      if (!m.label) continue;
      const right = x > left + width / 2;
      const below = y < top + height / 2;
      ctx.fillStyle = color;
      ctx.textAlign = right ? "right" : "left";
      ctx.textBaseline = below ? "top" : "bottom";
      ctx.fillText(m.label, x + (right ? -8 : 8) * pr, y + (below ? 5 : -5) * pr);
    }
    ctx.restore();
  }

  /** @param {number | null | undefined} idx the cursor's data index */
  _cursor(idx) {
    const i = idx === null || idx === undefined || idx < 0 || !this.x.length ? null : idx;
    if (i === this.hover) return;
    this.hover = i;
    this._legend(i);
    if (this.o.onhover) this.o.onhover(i);
  }

  /** A text over the chart while its data loads, points drawn or not (null: none). */
  /** @param {string | null} text */
  setLoading(text) {
    this.loadingText = text || null;
    this._showEmpty();
  }

  _showEmpty() {
    const text = this.loadingText || (this.x.length ? "" : this.o.empty || "");
    if (this.emptyEl.textContent !== text) this.emptyEl.textContent = text;
    this.emptyEl.hidden = !text;
    // over live points the text gets a backdrop, so it stays legible
    this.emptyEl.classList.toggle("over", Boolean(this.loadingText) && this.x.length > 0);
  }

  /** Mark a moment (unix ts) on a time chart; null: none. */
  /** @param {number | null} ts */
  setMoment(ts) {
    if (this.o.x === "time") markMoment(this.u, ts);
  }

  // ------------------------------------------------------------ legend

  _makeLegend() {
    const legend = document.createElement("div");
    legend.className = "mc-legend";
    this.items = this.o.series.map((s) => {
      const item = document.createElement("span");
      item.className = "mc-item";
      const help = s.help || explain(s.label);
      if (help) item.title = help;
      const i = document.createElement("i");
      i.style.background = rgba(s.rgb, s.fill !== undefined && !s.bars ? Math.max(0.75, s.fill) : 1);
      if (s.dash) i.classList.add("dash");
      const v = document.createElement("b");
      item.append(i, `${s.label} `, v);
      legend.append(item);
      return v;
    });
    if (this.o.x === "time") {
      this.xItem = document.createElement("span");
      this.xItem.className = "mc-x";
      legend.prepend(this.xItem);
    }
    this.el.append(legend);
    return legend;
  }

  /** @param {number | null} idx the data index shown (null: the latest, or legendIdx's) */
  _legend(idx) {
    if (!this.legend) return;
    const o = this.o;
    const i = idx !== null ? idx : o.legendIdx ? o.legendIdx(this.x) : this.lastIndex;
    if (this.xItem) this.xItem.textContent = i >= 0 && this.x.length ? hms(this.x[i]) : "";
    for (let k = 0; k < o.series.length; k++) {
      const s = o.series[k];
      const v = i >= 0 && this.ys[k] ? this.ys[k][i] : null;
      const text = s.unknown ? "not known" : v === null || v === undefined ? "—" : (s.fmt || compact)(v);
      if (this.items[k].textContent !== text) this.items[k].textContent = text;
      const item = /** @type {HTMLElement} */ (this.items[k].parentElement);
      if (s.unknown) item.dataset.unknown = s.unknown;
      else delete item.dataset.unknown;
      const title = s.unknown ? `not known: ${s.unknown}` : s.help || explain(s.label);
      if (item.title !== title) item.title = title;
    }
  }
}
