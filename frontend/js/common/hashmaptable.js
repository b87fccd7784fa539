// @ts-check
// The hash-map table both pages draw: one row per key, keys held by several
// blocks marked (`multi`, css/common.css), a click handing the key to the
// page, a muted line when no key shows.  What a row holds differs by page:
// the dashboard's keys are (hash64, group) with their block ids from its
// hash index; the fleet page's are an instance's hashes with parent, media,
// tokens and LoRA from its copy of the map (an observer never sees block
// ids).  The table and its marks are this one.

import { h } from "./dom.js";

/**
 * A key as a row: its hash, how many blocks hold it, its cells after the
 * hash (`copiesAt`: the index among them of the copies cell, marked when
 * several), the row's title and what a click does.
 * @typedef {{hash: string, copies: number, cells: (HTMLTableCellElement)[], copiesAt: number, title?: string, onClick: () => void}} KeyRow
 */

/**
 * Draw `rows` into `body` (replacing what it held).
 * @param {HTMLElement} body a <tbody>
 * @param {KeyRow[]} rows
 * @param {{hashCell: (hash: string) => HTMLTableCellElement, empty?: string, columns?: number}} opts
 *   hashCell: the page's hash cell; empty: the line shown when there is no row
 */
export function renderKeyRows(body, rows, { hashCell, empty = "", columns = 1 }) {
  const trs = rows.map((r) => {
    const copies = r.cells[r.copiesAt];
    if (copies) copies.classList.add("copies");
    return h(
      "tr",
      { class: r.copies > 1 ? "keyrow multi" : "keyrow", "data-hash": r.hash, title: r.title || "", onclick: r.onClick },
      hashCell(r.hash),
      ...r.cells,
    );
  });
  if (!trs.length && empty) trs.push(h("tr", {}, h("td", { colspan: String(columns), class: "muted" }, empty)));
  body.replaceChildren(...trs);
}
