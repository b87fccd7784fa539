// The page's error line over the map: the last error for a few seconds, and
// every error kept (the tests read them).

import { $ } from "../../common/dom.js";

export const errors = [];

export function showError(msg) {
  errors.push(msg);
  const el = $("errline");
  el.textContent = msg;
  el.classList.add("on");
  clearTimeout(showError.timer);
  showError.timer = setTimeout(() => el.classList.remove("on"), 8000);
}
