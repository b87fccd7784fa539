// @ts-check
// A time chart's x axis, shared by the dashboard's live charts and the fleet
// page's events/s chart: the span it shows (a lone point or a few seconds of
// points still read as clock times, never years nor one time repeated) and
// the room its last clock label needs right of the plot, where uPlot centres
// it on the plot's edge -- measured in the axis's font, whatever the
// machine's system font is.

import { textWidth } from "./textwidth.js";

/** The least span a time axis shows (s). */
export const MIN_SPAN = 30;

/**
 * The x range for points from lo to hi (unix s): at least MIN_SPAN, ending at the latest.
 * @param {number | null | undefined} lo
 * @param {number | null | undefined} hi
 * @returns {[number, number]}
 */
export function timeRange(lo, hi) {
  if (hi === null || hi === undefined || !Number.isFinite(hi)) {
    const now = Date.now() / 1000;
    return [now - MIN_SPAN, now];
  }
  const from = lo === null || lo === undefined || !Number.isFinite(lo) ? hi : lo;
  return hi - from >= MIN_SPAN ? [from, hi] : [hi - MIN_SPAN, hi];
}

// every digit in every place: a clock label ("HH:MM:SS") is never wider than the widest of these
const CLOCKS = Array.from({ length: 10 }, (_, d) => `${d}${d}:${d}${d}:${d}${d}`);

/**
 * Half the widest clock label drawn in `font`, rounded up, in px (0 without a DOM).
 * @param {string} font
 */
export function clockHalf(font) {
  return Math.ceil(textWidth(CLOCKS, font) / 2);
}
