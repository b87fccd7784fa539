// @ts-check
// How wide text is drawn on a canvas in a given font: the room a chart's
// axis label needs (the dashboard's charts and the fleet page's).

import { context2d } from "./dom.js";

/** @type {CanvasRenderingContext2D | null} */
let measurer = null;

/**
 * The widest of `labels` in px, drawn in `font`, rounded up (0 without a DOM).
 * @param {unknown[]} labels
 * @param {string} font a canvas font ("11px system-ui")
 */
export function textWidth(labels, font) {
  if (!measurer) {
    if (typeof document === "undefined") return 0;
    measurer = context2d(document.createElement("canvas"));
  }
  measurer.font = font;
  let w = 0;
  for (const t of labels) if (t) w = Math.max(w, measurer.measureText(String(t)).width);
  return Math.ceil(w);
}
