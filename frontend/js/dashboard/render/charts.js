// @ts-check
// Charts (uPlot, vendored): pool usage split into in use / cached / empty
// (stacked), prefix hit rate, allocations and evictions per second, and the
// eviction-sample histograms (lifetime, idle before eviction, reuse gaps).

import { $ } from "../../common/dom.js";
import { clockText, compact, dur, durTick } from "../../common/format.js";
import { COLORS, rgbCss, rgba } from "../../common/palette.js";
import { clockHalf, timeRange } from "../../common/timeaxis.js";
import { AXIS_STROKE, FONT, GRID, INT_INCRS, apartFilter, labelWidth } from "./chartscale.js";
import { barPaths } from "./minichart.js";
import { markMoment } from "./moment.js";

/** @typedef {import("../../../vendor/uplot/uPlot")} UPlot */
/** @typedef {import("../../../vendor/uplot/uPlot").Options} UPlotOptions */

const uPlot = window.uPlot;
const AXIS = { stroke: AXIS_STROKE, grid: GRID, ticks: { show: false } };


/**
 * The time charts' axes: clock times on x, `yFmt` on y (uPlot's own when none).
 * @param {((v: number) => string) | null} [yFmt]
 * @returns {import("../../../vendor/uplot/uPlot").Axis[]}
 */
function axes(yFmt) {
  return [
    { ...AXIS, font: FONT, space: 70, values: (u, vals) => vals.map((v) => clockText(v)) },
    { ...AXIS, font: FONT, size: 48, values: yFmt ? (u, vals) => vals.map(yFmt) : undefined },
  ];
}


// Fixed plot heights: sizes come from the container's width only (a height
// read back from the container would grow with the plot).
/** @param {HTMLElement} el */
function sizeOf(el) {
  return { width: Math.max(120, el.clientWidth), height: Number(el.dataset.h) || 140 };
}

// (axis ticks below 10 keep their decimal: an idle axis reads 1, 0.5, 0, never "1, 1, 0")

export class Charts {
  /** @param {import("../state/model.js").PoolModel} model */
  constructor(model) {
    this.model = model;
    this.windowSel = $("chart-window", HTMLSelectElement);
    /** @type {[UPlot, HTMLElement][]} every plot and its container (resized together) */
    this.plots = [];
    /** @type {{in_use: number[], cached: number[], empty: number[]}} the stacked chart's own values (its legend) */
    this.raw = { in_use: [], cached: [], empty: [] };
    const raw = this.raw;
    /** @type {(name: "in_use" | "cached" | "empty") => import("../../../vendor/uplot/uPlot").Series.Value} */
    const rawVal = (name) => (u, v, si, i) => (i === null || i === undefined || raw[name][i] === undefined ? "—" : compact(raw[name][i]));
    this.usage = this.make("chart-usage", {
      series: [
        {},
        { label: "empty", stroke: rgbCss([110, 118, 129]), fill: rgba(COLORS.empty, 0.9), width: 1, value: rawVal("empty") },
        { label: "cached", stroke: rgbCss(COLORS.cached), fill: rgba(COLORS.cached, 0.55), width: 1, value: rawVal("cached") },
        { label: "in use", stroke: rgbCss(COLORS.in_use[1]), fill: rgba(COLORS.in_use[0], 0.75), width: 1, value: rawVal("in_use") },
      ],
      axes: axes(compact),
      scales: { y: { range: (u, lo, hi) => [0, hi] } },
    });
    const pctFmt = (/** @type {number} */ v) => `${Math.round(v * 100)}%`;
    this.hit = this.make("chart-hit", {
      series: [
        {},
        { label: "per tick (1s avg)", stroke: "#d2a8ff", width: 1, spanGaps: true, value: (u, v) => (v === null ? "—" : pctFmt(v)) },
        { label: "cumulative", stroke: "#8b949e", width: 1, dash: [4, 3], value: (u, v) => (v === null ? "—" : pctFmt(v)) },
      ],
      axes: axes(pctFmt),
      scales: { y: { range: [0, 1] } },
    });
    this.rates = this.make("chart-rates", {
      series: [
        {},
        // equal rates (a full pool: every allocation evicts) would draw one
        // line over the other: allocations wide and solid, evictions dashed
        // on top, so both show where they coincide
        { label: "alloc/s", stroke: rgbCss(COLORS.in_use[1]), width: 2.5, value: (u, v) => (v === null ? "—" : compact(v)) },
        { label: "evict/s", stroke: rgbCss(COLORS.risk), width: 1.5, dash: [5, 4], value: (u, v) => (v === null ? "—" : compact(v)) },
      ],
      axes: axes(compact),
      scales: { y: { range: (u, lo, hi) => [0, Math.max(1, hi)] } },
    });
    /** @type {Record<string, UPlot>} */
    this.hists = {};
    for (const [name, color] of /** @type {[string, import("../../common/palette.js").RGB][]} */ ([
      ["lifetime", COLORS.in_use[1]],
      ["idle", COLORS.cached],
      ["reuse_gap", [210, 168, 255]],
    ])) {
      this.hists[name] = this.makeHist(`hist-${name}`, color);
    }
    /** @type {number[] | null} the histograms' bucket bounds (their x labels) */
    this.buckets = null;
    /** @type {number | null} the moment marked (time travel), unix s */
    this.momentTs = null;
    this.histKey = "";
    this.widths = "";
    new ResizeObserver(() => this.resize()).observe($("charts"));
  }

  /**
   * A time chart in the element `id`.
   * @param {string} id
   * @param {Omit<UPlotOptions, "width" | "height">} opts
   */
  make(id, opts) {
    const el = $(id);
    const plot = new uPlot(
      {
        ...sizeOf(el),
        legend: { live: true },
        cursor: { drag: { x: false, y: false } },
        // room right of the plot for half of the last clock label (centred on its edge)
        padding: [null, () => clockHalf(FONT) + 2, null, null],
        ...opts,
        // the points' span, at least MIN_SPAN s: a dashboard just opened reads
        // clock times (uPlot would widen one point to a thousand days, and a
        // second of points to one time repeated)
        scales: { ...opts.scales, x: { time: true, range: (u) => timeRange(u.data[0][0], u.data[0][u.data[0].length - 1]) } },
      },
      [[], ...opts.series.slice(1).map(() => [])],
      el,
    );
    this.plots.push([plot, el]);
    return plot;
  }

  /**
   * A histogram in the element `id`, its bars in `color`.
   * @param {string} id
   * @param {import("../../common/palette.js").RGB} color
   */
  makeHist(id, color) {
    const el = $(id);
    const bars = barPaths({ size: [0.8, 40], gap: 1 });
    const plot = new uPlot(
      {
        ...sizeOf(el),
        legend: { show: false },
        cursor: { show: true, points: { show: false }, drag: { x: false, y: false } },
        scales: { x: { time: false }, y: { range: (u, lo, hi) => [0, Math.max(1, hi)] } },
        axes: [
          // bucket labels never closer than the widest of them (+ a gap)
          {
            ...AXIS,
            font: FONT,
            incrs: INT_INCRS,
            space: () => Math.max(24, labelWidth(this.bucketLabels(), FONT) + 8),
            filter: apartFilter((i) => this.bucketLabel(i), FONT),
            values: (u, vals) => vals.map((i) => (i === null ? "" : this.bucketLabel(i))),
          },
          { ...AXIS, font: FONT, size: 40, incrs: INT_INCRS, values: (u, vals) => vals.map(compact) },
        ],
        series: [{}, { label: "samples", fill: rgba(color, 0.7), stroke: rgbCss(color), paths: bars, points: { show: false } }],
      },
      [[], []],
      el,
    );
    // no samples: said in words over the whole bucket axis (not a bare pair of edge labels)
    const note = document.createElement("div");
    note.className = "hist-empty";
    note.textContent = "no samples yet";
    note.hidden = true;
    el.append(note);
    this.plots.push([plot, el]);
    return plot;
  }

  /** @param {number} i a bucket's index (its x value) */
  bucketLabel(i) {
    const b = this.buckets;
    if (!b || i !== Math.round(i) || i < 0) return "";
    if (i >= b.length) return `>${durTick(b[b.length - 1])}`;
    return `≤${durTick(b[i])}`;
  }

  bucketLabels() {
    const b = this.buckets || [];
    return [...b.map((_, i) => this.bucketLabel(i)), this.bucketLabel(b.length)];
  }

  /**
   * Mark the moment time travel shows (unix ts) on the time charts; null: none.
   * @param {number | null} ts
   */
  setMoment(ts) {
    this.momentTs = ts;
    for (const plot of [this.usage, this.hit, this.rates]) markMoment(plot, ts);
  }

  resize() {
    const widths = this.plots.map(([, el]) => el.clientWidth).join(",");
    if (widths === this.widths) return;
    this.widths = widths;
    for (const [plot, el] of this.plots) plot.setSize(sizeOf(el));
  }

  update() {
    const m = this.model;
    const pts = m.points;
    if (!pts.length) return;
    const span = Number(this.windowSel.value) || 120;
    const lastTs = pts[pts.length - 1].ts;
    let i0 = pts.length - 1;
    while (i0 > 0 && lastTs - pts[i0 - 1].ts <= span) i0--;
    const n = pts.length - i0;
    const x = new Array(n);
    const inUse = new Array(n);
    const cached = new Array(n);
    const empty = new Array(n);
    const s1 = new Array(n);
    const s2 = new Array(n);
    const s3 = new Array(n);
    const hit = new Array(n);
    const hitTotal = new Array(n);
    const alloc = new Array(n);
    const evict = new Array(n);
    // the per-tick hit rate is noisy: average over ~1 s of ticks that had queries
    const hz = (m.config && m.config.tick_hz) || 20;
    const win = Math.max(1, Math.round(hz));
    let acc = 0;
    let cnt = 0;
    const q = [];
    for (let j = 0; j < n; j++) {
      const p = pts[i0 + j];
      x[j] = p.ts;
      inUse[j] = p.in_use;
      cached[j] = p.cached;
      empty[j] = p.empty;
      s3[j] = p.in_use;
      s2[j] = p.in_use + p.cached;
      s1[j] = p.in_use + p.cached + p.empty;
      const hr = p.hit_rate;
      q.push(hr);
      if (hr !== null && Number.isFinite(hr)) {
        acc += hr;
        cnt++;
      }
      if (q.length > win) {
        const old = q.shift();
        if (typeof old === "number" && Number.isFinite(old)) {
          acc -= old;
          cnt--;
        }
      }
      hit[j] = cnt ? acc / cnt : null;
      hitTotal[j] = p.hit_rate_total;
      alloc[j] = p.alloc_per_s;
      evict[j] = p.evict_per_s;
    }
    this.raw.in_use = inUse;
    this.raw.cached = cached;
    this.raw.empty = empty;
    this.usage.setData([x, s1, s2, s3]);
    this.hit.setData([x, hit, hitTotal]);
    this.rates.setData([x, alloc, evict]);
    // with no cursor on a chart, its legend shows the latest values
    for (const plot of [this.usage, this.hit, this.rates]) {
      if (plot.cursor.left === undefined || plot.cursor.left < 0) plot.setLegend({ idx: n - 1 });
    }
    this.updateHists();
  }

  updateHists() {
    const hs = this.model.histograms;
    if (!hs) return;
    const key = ["lifetime", "idle", "reuse_gap"].map((k) => (hs[k] ? hs[k].count : 0)).join("/");
    if (key === this.histKey) return;
    this.histKey = key;
    for (const [name, plot] of Object.entries(this.hists)) {
      const hg = hs[name];
      if (!hg || !hg.counts) continue;
      this.buckets = hg.buckets;
      // trim empty buckets at both ends (keep one of context); with no
      // samples at all, every bucket (the axis reads its whole range)
      let a = 0;
      let b = hg.counts.length - 1;
      if (hg.count > 0) {
        while (a < b && hg.counts[a] === 0) a++;
        while (b > a && hg.counts[b] === 0) b--;
        a = Math.max(0, a - 1);
        b = Math.min(hg.counts.length - 1, b + 1);
      }
      /** @type {number[]} */
      const xs = [];
      /** @type {number[]} */
      const ys = [];
      for (let i = a; i <= b; i++) {
        xs.push(i);
        ys.push(hg.counts[i]);
      }
      plot.setData([xs, ys]);
      const note = plot.root.parentElement && plot.root.parentElement.querySelector(".hist-empty");
      if (note instanceof HTMLElement) note.hidden = hg.count > 0;
      const title = /** @type {HTMLElement | null} */ (document.querySelector(`[data-hist-title="${name}"]`));
      if (title) {
        title.textContent = `${title.dataset.label} · n=${hg.count}${hg.count ? ` · mean ${dur(hg.sum / hg.count)}` : ""}`;
      }
    }
  }
}
