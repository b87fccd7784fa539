// What the page has that no module declares: uPlot, a classic script
// (vendor/uplot, typed by its own uPlot.d.ts), and the tests' hooks on
// window.__bp (js/dashboard/testhooks.js, loaded only by the tests and the
// benchmark).
import type UPlot from "../vendor/uplot/uPlot";

declare global {
  var uPlot: typeof UPlot;
  interface Window {
    __bp: Record<string, unknown>;
  }
}
