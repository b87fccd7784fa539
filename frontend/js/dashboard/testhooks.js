// @ts-check
// Test hooks: the dashboard's parts on window.__bp for the browser tests and
// the benchmark (tests/e2e/hooks.py injects this module; the page itself
// never loads it).  Importing main.js gives the page's own instance of it:
// a module URL is evaluated once per page.

import { COLORS, colorsForState } from "../common/palette.js";
import { parts } from "./main.js";

const { model, map, perf } = parts;

window.__bp = {
  ...parts,
  palette: { COLORS, colorsForState },
  ready: () => model.seq !== null && map.n === model.n,
  resetPerf() {
    perf.raf = 0;
    perf.frameMs = 0;
    perf.maxFrameMs = 0;
    perf.longFrames = 0;
    perf.started = performance.now();
    Object.assign(map.perf, { draws: 0, drawMs: 0, lastMs: 0, maxMs: 0, cells: 0, fullPaints: 0 });
  },
};
