// @ts-check
// The fleet page's view helpers: the shared DOM and format helpers the fleet
// modules use, and the table cells only this page draws.
// Text from the streams (instance names, LoRA names, media) is untrusted: it
// only ever goes in as text (common/dom.js's h).

import { $, clear, debounce, h } from "../common/dom.js";
import { age, int, shortHash as cut, tokensText } from "../common/format.js";

export { $, age, clear, debounce, h, int, tokensText };

/** A hash as shown here: the first 12 hex digits (the title holds all of it). */
export const shortHash = (/** @type {string | null | undefined} */ hash) => cut(hash, 12);

/** @param {string | null | undefined} hash */
export function hashCell(hash) {
  return h("td", { class: "hash", title: hash || "" }, shortHash(hash));
}
