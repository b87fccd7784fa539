// @ts-check
// MiniChart: the analysis row's small charts, drawn by uPlot (vendored, the
// library of the charts above them) in the same style: axis colour, grid,
// 11 px font. A thin adapter: time series (stacked areas or lines, on one or
// two y axes), bar histograms over categories, an x-y curve on a log2 x
// scale with marked points. uPlot draws on setData and on resize only, never
// per animation frame; a small legend line under the chart shows the values
// at the cursor (or the latest), and a note covers the plot while there is
// no data. What its scales show (ranges, ticks, stacked columns) is
// chartscale.js's, shared with the live charts.

import { clockText, compact } from "../../common/format.js";
import { rgba } from "../../common/palette.js";
import { explain } from "../../common/terms.js";
import { clockHalf } from "../../common/timeaxis.js";
import {
  AXIS_STROKE,
  CAT_INCRS,
  FONT,
  GRID,
  INT_INCRS,
  TIME_INCRS,
  Y_INCRS,
  apartFilter,
  fitSize,
  labelWidth,
  plotData,
  stackBands,
  xRange,
  yRange,
  ySpace,
} from "./chartscale.js";
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

/** @typedef {import("./chartscale.js").SeriesSpec} SeriesSpec */
/** @typedef {import("./chartscale.js").AxisSpec} AxisSpec */
/** @typedef {import("./chartscale.js").ChartMark} ChartMark */

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
    const axis = { stroke: AXIS_STROKE, grid: GRID, ticks: { show: false }, font: FONT };
    const bars = o.series.some((s) => s.bars);
    const xFmt = o.xFmt || String;
    const yIncrs = bars ? INT_INCRS : Y_INCRS;
    let xAxis;
    if (o.x === "time") {
      // a time label whose text would pass the plot's right edge (into the
      // second y axis or out of the chart), or reach under the y axis's
      // bottom label, is left out
      // (half the widest clock label, less the 10 px of padding a chart
      // without a second axis has on its right)
      const room = () => clockHalf(FONT) + (o.y2 ? 2 : -8);
      xAxis = {
        space: 64,
        incrs: TIME_INCRS,
        filter: (u, splits) => {
          const { min, max } = u.scales.x;
          const w = u.bbox.width / (u.pxRatio || 1);
          const px = (v) => ((v - min) / (max - min)) * w;
          const r = room();
          return splits.map((v) => (max > min && (px(v) < 20 || w - px(v) < r) ? null : v));
        },
        values: (u, vals) => vals.map((v) => (this.x.length && v !== null ? clockText(v) : "")),
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
      { ...axis, scale: "y", size: fitSize(o.yWidth || 38), gap: 4, space: (u, i, min, max, dim) => ySpace(dim), incrs: yIncrs, values: (u, vals) => vals.map((v) => ((o.y && o.y.fmt) || compact)(v)) },
    ];
    /** @type {import("../../../vendor/uplot/uPlot").Scales} */
    const scales = {
      x: o.x === "time" ? { time: true } : { time: false, ...(o.xLog2 ? { distr: 3, log: 2 } : {}) },
      y: { range: (u, lo, hi) => yRange(o.y, lo, hi, { marks: this.marks, axis: 1, dim: this._plotHeight(u), incrs: yIncrs }) },
    };
    scales.x.range = () => xRange(o, this.x);
    const y2 = o.y2;
    if (y2) {
      const c = y2.rgb ? rgba(y2.rgb) : AXIS_STROKE;
      axes.push({ ...axis, scale: "y2", side: 1, stroke: c, grid: { show: false }, size: fitSize(o.y2Width || 38), gap: 4, space: (u, i, min, max, dim) => ySpace(dim), incrs: Y_INCRS, values: (u, vals) => vals.map((v) => (y2.fmt || compact)(v)) });
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
    if (this.xItem) this.xItem.textContent = i >= 0 && this.x.length ? clockText(this.x[i]) : "";
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
