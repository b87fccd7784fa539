// @ts-check
// The page's error line over the map: the last error for a few seconds, and
// every error kept (the tests read them).

import { $ } from "../../common/dom.js";

/** @type {string[]} */
export const errors = [];
/** @type {ReturnType<typeof setTimeout> | undefined} */
let timer;

/** @param {string} msg */
export function showError(msg) {
  errors.push(msg);
  const el = $("errline");
  el.textContent = msg;
  el.classList.add("on");
  clearTimeout(timer);
  timer = setTimeout(() => el.classList.remove("on"), 8000);
}
