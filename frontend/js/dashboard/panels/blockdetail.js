// @ts-check
// What the detail panel shows of one block, whichever pool it shows: its
// title (id and state badge) and a key-value table's rows -- and the whole
// view of a block of a recorded moment (history mode: the map's state at an
// op, no live details to fetch).

import { h } from "../../common/dom.js";
import { int } from "../../common/format.js";
import { explain } from "../../common/terms.js";

/** @type {Record<string, string>} */
const STATE_LABEL = { null: "null", in_use: "in use", cached: "cached", empty: "empty" };

/**
 * "Block #N" and its state badge, each with its meaning on hover (block #0: the null block).
 * @param {number} id
 * @param {string} state
 */
export function blockTitle(id, state) {
  return [
    h("span", { class: "bt-id", title: id === 0 ? explain("null") : explain("block") }, `Block #${id}`),
    " ",
    h("span", { class: `badge st-${state}`, id: "detail-state", title: explain(STATE_LABEL[state]) }, STATE_LABEL[state]),
  ];
}

/**
 * A key-value table's rows, and row(key, value, attrs) that adds one (the
 * key's meaning on hover).
 */
export function kvRows() {
  /** @type {HTMLElement[]} */
  const rows = [];
  /** @type {(k: string, v: string, attrs?: Record<string, unknown> | null) => number} */
  const row = (k, v, attrs) => rows.push(h("tr", null, h("th", { title: explain(k) || null }, k), h("td", attrs || null, v)));
  return { rows, row };
}

/**
 * A block of a recorded moment in the panel (`title`, `root`): its state,
 * ref count, hash, queue position and holders as recorded; without a block
 * (id out of range), the moment's summary.
 * @param {HTMLElement} title
 * @param {HTMLElement} root
 * @param {import("../state/history.js").Moment & {id: number}} moment
 */
export function renderMoment(title, root, moment) {
  const { st, src, id } = moment;
  const seq = int(st.at.seq);
  root.replaceChildren();
  if (id < 0 || id >= src.n) {
    title.textContent = "Block";
    const b = st.summary.blocks;
    root.append(
      h("p", { class: "hist-note" }, `The recorded moment at op ${seq}: ${int(b.in_use)} in use · ${int(b.cached)} cached · ${int(b.empty)} empty · ${int(st.summary.running_requests)} running requests.`),
      h("p", { class: "muted" }, "Click a block for its recorded state. Holders' details and sampled times are for the live pool only (back to live)."),
    );
    return;
  }
  const state = ["null", "in_use", "cached", "empty"][src.state[id]];
  title.replaceChildren(
    ...blockTitle(id, state),
    h("span", { class: "pin hist-tag", title: "a recorded moment, not the live pool" }, `at op ${seq}`),
  );
  const { rows, row } = kvRows();
  row("ref count", String(src.refCnt[id]), { id: "detail-ref" });
  row("hash64", src.hash64[id] || "—", { id: "detail-hash", class: "mono" });
  const pos = st.queue.block_ids.indexOf(id);
  const free = state === "cached" || state === "empty";
  row(
    "queue position",
    !free ? "— (not free)" : pos >= 0 ? `pos ${int(pos)} of ${int(st.queue.total)}` : `beyond the first ${int(st.queue.block_ids.length)} of ${int(st.queue.total)}`,
    { id: "detail-qpos" },
  );
  const holders = (st.requests.items || []).filter((r) => r.block_ids.some((g) => (Array.isArray(g) ? g : [g]).includes(id))).map((r) => r.request_id);
  row("holders", holders.length ? holders.join(", ") : state === "in_use" ? "(not among the requests listed)" : "none", { id: "detail-holders" });
  root.append(h("table", { class: "kv" }, ...rows), h("p", { class: "muted" }, `recorded at op ${seq} (${new Date(st.at.ts * 1000).toTimeString().slice(0, 8)}); sampled times are for the live pool only`));
}
