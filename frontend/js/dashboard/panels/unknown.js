// @ts-check
// A figure this service does not know: "not known" (on a mirror: "not known
// on a mirror"), with the reason on hover -- never a default 0, never a bare
// "—" that reads as data.  The server says why where it knows (`reason`,
// `requests_reason`); where an older server only sends its default, the
// reasons here say it.

import { h } from "../../common/dom.js";

/** Whether this page shows a mirror of a real engine (the mirror item sets it). */
export const onMirror = () => document.body.dataset.mirror === "1";

/** Why a mirror cannot know a figure, where the server does not say. */
export const MIRROR_WHY = {
  tokens:
    "the engine's plugin tells blocks and their hashes, never how many tokens a block holds: the tokens held, the tail waste and the fill are not known here (slots reserved = blocks in use × block size)",
  requests:
    "this server does not follow the engine's running and waiting queues (a blockpool older than the plugin's queue figures): a 0 here would be a default, not the engine's",
  owners: "a mirror's pool is told block operations and hashes, not which request stored a block or which one took it",
};

/** The words for a figure not known here. */
export const unknownText = () => (onMirror() ? "not known on a mirror" : "not known");

/**
 * The hover text of an unknown figure.
 * @param {string} reason
 */
export const unknownTitle = (reason) => `${unknownText()}: ${reason}`;

/**
 * An unknown figure as an element (data-unknown carries the reason).
 * @param {string} reason
 * @param {string} [text] shorter words where the room is small
 */
export function unknownEl(reason, text) {
  return h("span", { class: "unknown", title: unknownTitle(reason), "data-unknown": reason }, text || unknownText());
}
