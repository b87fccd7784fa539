// The charts' data side (render/chartscale.js: the analysis row's MiniCharts
// and the live charts): the columns uPlot gets (stacked sums, category
// indices, gaps), the bands that fill between stacked series, the scales'
// ranges, and axis labels kept apart. The drawing itself is uPlot's, checked
// in the browser tests (tests/e2e/test_analysis_panels.py).
import assert from "node:assert/strict";
import { test } from "node:test";

import { fitSize, keepApart, niceTop, plotData, stackBands, xRange, yRange } from "../js/dashboard/render/chartscale.js";
import { compact, durTick } from "../js/common/format.js";

const stacked = { x: "time", series: [{ stack: true }, { stack: true }, { stack: true }] };

test("stacked series become running sums; a gap keeps the sum below it", () => {
  const d = plotData(stacked, [10, 11, 12], [
    [1, 2, null],
    [3, null, 4],
    [5, 6, 7],
  ]);
  assert.deepEqual(d[0], [10, 11, 12]);
  assert.deepEqual(d[1], [1, 2, null]);
  assert.deepEqual(d[2], [4, null, 4]);
  assert.deepEqual(d[3], [9, 8, 11]);
  // the top of the stack is the sum of every series' value
  assert.deepEqual(stackBands(stacked.series), [{ series: [2, 1] }, { series: [3, 2] }]);
});

test("lines pass through; missing and non-finite values are gaps", () => {
  const o = { x: "time", series: [{}, { axis: 2 }] };
  const d = plotData(o, [1, 2, 3], [[0, NaN, 2], [undefined, 5]]);
  assert.deepEqual(d, [[1, 2, 3], [0, null, 2], [null, 5, null]]);
  assert.deepEqual(stackBands(o.series), []);
  // the input is not touched
  const xs = [1, 2];
  assert.notEqual(plotData(o, xs, [[1, 2], [3, 4]])[0], xs);
});

test("category charts plot at the indices, bars centred in their slot", () => {
  const o = { x: "cat", series: [{ bars: true }] };
  const d = plotData(o, [0.01, 0.02, "+Inf"], [[0, 8, 1]]);
  assert.deepEqual(d, [[0, 1, 2], [0, 8, 1]]);
  assert.deepEqual(xRange(o, [0.01, 0.02, "+Inf"]), [-0.5, 2.5]);
  assert.deepEqual(xRange(o, []), [-0.5, 0.5]);
});

test("x ranges: the data's span; a log2 curve padded a little; one point widened", () => {
  assert.deepEqual(xRange({ x: "time" }, [100, 160]), [100, 160]);
  assert.deepEqual(xRange({ x: "time" }, [100]), [99, 101]);
  const [a, b] = xRange({ x: "num", xLog2: true }, [0.5, 1, 2, 4]);
  assert.ok(a < 0.5 && a > 0.25 && b > 4 && b < 8, `${a} ${b}`);
  assert.ok(Math.abs(Math.log2(0.5 / a) - Math.log2(b / 4)) < 1e-9, "as much on each side");
});

test("y ranges: from 0 to a labelled round top, marks included, or the axis's own range", () => {
  // 88 px: ticks at least 24 px apart, 3 or 4 of them
  assert.deepEqual(yRange(undefined, 0, 347, { dim: 88 }), [0, 400]);
  assert.deepEqual(yRange(undefined, 0, 590, { dim: 88 }), [0, 600]);
  assert.deepEqual(yRange(undefined, 0, 2100, { dim: 88 }), [0, 3000]);
  assert.deepEqual(yRange(undefined, 0, 1, { dim: 88 }), [0, 1]);
  assert.deepEqual(yRange(undefined, null, null, { dim: 88 }), [0, 1], "no data");
  assert.deepEqual(yRange(undefined, 0, 0, { dim: 88 }), [0, 1]);
  const marks = [{ x: 1, y: 9 }, { x: 1, y: 50, axis: 2 }];
  assert.deepEqual(yRange(undefined, 0, 3, { marks, dim: 88 }), [0, 10], "a mark above the data");
  assert.deepEqual(yRange(undefined, 0, 3, { marks, axis: 2, dim: 88 }), [0, 60]);
  const spec = { range: (lo, hi) => [lo - 0.05, hi + 0.05] };
  const [lo, hi] = yRange(spec, 0.6, 0.7, { marks: [{ x: 1, y: 0.5 }] });
  assert.ok(Math.abs(lo - 0.45) < 1e-12 && Math.abs(hi - 0.75) < 1e-12);
  assert.deepEqual(yRange(spec, null, null), [-0.05, 1.05]);
});

test("niceTop: a multiple of the tick step, ticks far enough apart", () => {
  const INTS = [1, 2, 5, 10, 20, 50, 100];
  for (const [hi, dim, incrs, top] of [
    [8, 36, INTS, 10], // a 36 px histogram: 0, 5, 10
    [1, 36, INTS, 1],
    [3, 60, INTS, 3],
    [0.07, 88, undefined, 0.1],
    [13.2, 88, undefined, 15],
    [750, 88, undefined, 1000],
    [101, 200, undefined, 120],
  ]) {
    const got = niceTop(hi, dim, incrs);
    assert.equal(got, top, `${hi} on ${dim} px`);
    const space = Math.min(24, Math.max(12, dim / 3));
    const step = (incrs || [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500]).find((s) => (dim * s) / got >= space);
    assert.ok(Math.abs(got / step - Math.round(got / step)) < 1e-9, `${got} is a multiple of the step ${step}`);
  }
});

test("compact", () => {
  assert.deepEqual([null, 0, 3, 2.5, 12.4, 1234, 45678, 2.5e6].map(compact), ["—", "0", "3", "2.5", "12", "1.2k", "46k", "2.5M"]);
});

test("keepApart: axis labels never touch, first come first kept, empty ones skipped", () => {
  // centres 0, 20, 40, 60, 80 px; 30 px wide labels need 36 px between centres (gap 6)
  assert.deepEqual(keepApart([0, 20, 40, 60, 80], [30, 30, 30, 30, 30], 6), [true, false, true, false, true]);
  // an empty label neither shows nor blocks the next one
  assert.deepEqual(keepApart([0, 10, 40], [30, 0, 30], 6), [true, false, true]);
  // wide enough apart: all kept; NaN positions (left out splits) never kept
  assert.deepEqual(keepApart([0, 50, NaN, 100], [40, 40, 40, 40], 6), [true, true, false, true]);
  // whatever the widths, no two kept labels overlap
  const px = Array.from({ length: 40 }, (_, i) => i * 7);
  const widths = px.map((_, i) => 10 + ((i * 13) % 37));
  const keep = keepApart(px, widths, 4);
  const shown = px.map((p, i) => [p - widths[i] / 2, p + widths[i] / 2]).filter((_, i) => keep[i]);
  for (let i = 1; i < shown.length; i++) assert.ok(shown[i][0] >= shown[i - 1][1] + 4, `labels ${i - 1} and ${i} touch`);
  assert.ok(shown.length > 3);
});

test("keepApart: a label that would pass the canvas's edges is left out and blocks nothing", () => {
  // the plot from 0 to 160 px, the canvas from -30 (under the y axis) to 170
  // a last label 40 wide centred at 152 ends at 172: cut, so not kept
  assert.deepEqual(keepApart([8, 72, 152], [40, 40, 40], 6, -30, 170), [true, true, false]);
  // a first label reaching past -30 is left out; the next one is then kept
  assert.deepEqual(keepApart([-20, 20, 70], [40, 40, 40], 6, -30, 170), [false, true, true]);
  // exactly at the edges still fits; no bounds given: none is cut
  assert.deepEqual(keepApart([-10, 150], [40, 40], 6, -30, 170), [true, true]);
  assert.deepEqual(keepApart([8, 72, 152], [40, 40, 40], 6), [true, true, true]);
});

test("durTick: short axis durations", () => {
  assert.deepEqual([0.001, 0.25, 1, 30, 60, 120, 90, 1800, 5400].map(durTick), ["1ms", "250ms", "1s", "30s", "1m", "2m", "1.5m", "30m", "1.5h"]);
  assert.equal(durTick(null), "—");
});

test("a y axis is as wide as its widest label beside its ticks and gap, and never narrower than asked", () => {
  // a canvas whose font draws 7 px a character (node has no DOM)
  const measure = (/** @type {string} */ t) => ({ width: 7 * String(t).length });
  const canvas = { getContext: () => ({ font: "", measureText: measure }) };
  /** @type {any} */ (globalThis).document = { createElement: () => canvas };
  try {
    const size = fitSize(30);
    const u = /** @type {any} */ ({ axes: [{}, { ticks: { size: 10 }, gap: 4 }] });
    assert.equal(size(u, ["5", "50"], 1), 30); // 14 + 10 + 4 + 1 = 29: the least asked
    assert.equal(size(u, ["100", "150"], 1), 36); // a count of 100 widens it: 21 + 15
    assert.equal(size(u, ["1.5k"], 1), 43);
    assert.equal(size(u, /** @type {any} */ (null), 1), 30); // before uPlot has labels
  } finally {
    delete (/** @type {any} */ (globalThis).document);
  }
});
