// @ts-check
// The LRU free queue, computed from the model (free blocks sorted by stamp:
// head = next to be reused).  A strip shows the whole queue (cached vs
// empty); the list shows its head with an estimated time to eviction from
// the allocation rate; cached blocks inside the horizon are "at risk" and
// stand out here, on the map, and grouped by the prefix they belong to.

import { $, context2d, h, setText } from "../../common/dom.js";
import { dur, int, rate, shortHash } from "../../common/format.js";
import { COLORS, rgbCss } from "../../common/palette.js";
import { explain } from "../../common/terms.js";
import { CACHED, hex64 } from "../wire/protocol.js";

const LIST_ROWS = 120;
const MAX_RISK = 50000;

/**
 * Mean allocation rate (blocks/s) over the last `seconds` of points.
 * @param {import("../wire/protocol.js").SeriesPoint[]} points
 * @param {number} [seconds]
 */
export function allocRate(points, seconds = 3) {
  if (!points.length) return 0;
  const last = points[points.length - 1].ts;
  let sum = 0;
  let n = 0;
  for (let i = points.length - 1; i >= 0 && last - points[i].ts <= seconds; i--) {
    const v = points[i].alloc_per_s;
    if (v !== null && Number.isFinite(v)) {
      sum += v;
      n++;
    }
  }
  return n ? sum / n : 0;
}

export class LruPanel {
  /**
   * @param {import("../state/model.js").PoolModel} model
   * @param {import("../render/blockmap.js").BlockMap} map
   * @param {import("../state/prefixtree.js").PrefixTree} tree
   * @param {(id: number) => void} onSelect a click on a block of the list
   */
  constructor(model, map, tree, onSelect) {
    this.model = model;
    this.map = map;
    this.tree = tree;
    this.onSelect = onSelect;
    this.strip = $("lru-strip", HTMLCanvasElement);
    this.sctx = context2d(this.strip);
    this.summary = $("lru-summary");
    this.body = $("lru-body");
    this.prefixes = $("lru-prefixes");
    this.horizonSel = $("lru-horizon", HTMLSelectElement);
    this.rate = 0;
    /** @type {Uint8Array | null} the whole queue, 1 = cached (model.queueProfile) */
    this.profile = null;
    this.profileAt = -Infinity;
    this.profileCost = 0;
    this.riskCount = 0;
    /** @type {import("../state/history.js").Moment | null} a recorded moment shown instead of the live queue */
    this.moment = null;
  }

  /**
   * Show the free queue of a recorded moment (GET /api/history/state), or live again (null).
   * @param {import("../state/history.js").Moment | null} m
   */
  setMoment(m) {
    this.moment = m;
    if (m) this.renderMoment(m);
    else this.profileAt = -Infinity;
  }

  /** @param {import("../state/history.js").Moment} moment */
  renderMoment(moment) {
    const { st, src } = moment;
    const ids = st.queue.block_ids;
    const b = st.summary.blocks;
    const seq = int(st.at.seq);
    this.map.setRisk([]);
    this.summary.replaceChildren(
      h("span", { class: "hist-tag" }, `recorded at op ${seq}`),
      h("span", { title: "free blocks: cached + empty" }, "free ", h("b", { id: "lru-free" }, int(st.queue.total))),
      h("span", { title: explain("cached") }, "cached ", h("b", null, int(b.cached))),
    );
    const ctx = this.sctx;
    ctx.fillStyle = rgbCss(COLORS.background);
    ctx.fillRect(0, 0, this.strip.width, this.strip.height);
    this.prefixes.replaceChildren(
      h("span", { class: "muted" }, `the queue's head at op ${seq}: the first ${int(ids.length)} of ${int(st.queue.total)} free blocks (times to eviction and blocks at risk are for the live pool only)`),
    );
    const rows = ids.map((id, pos) => {
      const cached = src.state[id] === CACHED;
      const hx = src.hash64[id] || "";
      return h(
        "tr",
        { class: cached ? "cached" : "", "data-block": String(id) },
        h("td", { class: "num" }, String(pos)),
        h("td", { class: "num" }, `#${id}`),
        h("td", null, h("span", { class: `dot st-${cached ? "cached" : "empty"}` }), cached ? "cached" : "empty"),
        h("td", { class: "mono" }, hx ? shortHash(hx, 12) : ""),
        h("td", { class: "num muted" }, "—"),
      );
    });
    this.body.replaceChildren(...rows);
    setText($("lru-count"), `recorded: head ${ids.length} of ${int(st.queue.total)}`);
  }

  get horizon() {
    return Number(this.horizonSel.value) || 10;
  }

  /**
   * Seconds until the block at queue position `pos` is reused.
   * @param {number | null | undefined} pos
   */
  eta(pos) {
    if (pos === null || pos === undefined) return null;
    return this.rate > 0.01 ? pos / this.rate : Infinity;
  }

  /** @param {number} now performance.now() */
  update(now) {
    const m = this.model;
    if (m.seq === null || this.moment) return;
    this.rate = allocRate(m.points);
    const reach = Math.ceil(this.rate * this.horizon); // positions reused within the horizon
    const want = Math.min(Math.max(LIST_ROWS, reach), MAX_RISK);
    const head = m.queueHead(want);
    // at risk: cached blocks the next `reach` allocations will take
    /** @type {number[]} */
    const risk = [];
    let firstCached = -1;
    for (let i = 0; i < head.length; i++) {
      if (m.state[head[i]] !== CACHED) continue;
      if (firstCached < 0) firstCached = i;
      if (i < reach) risk.push(head[i]);
    }
    this.map.setRisk(risk);
    this.riskCount = risk.length;
    // the whole-queue profile is a full sort: refresh it less often on big pools
    if (now - this.profileAt > Math.max(1000, this.profileCost * 20)) {
      const t0 = performance.now();
      this.profile = m.queueProfile();
      this.profileCost = performance.now() - t0;
      this.profileAt = now;
    }
    const free = m.header.num_free_blocks ?? head.length;
    const cached = m.header.blocks ? m.header.blocks.cached : 0;
    if (firstCached < 0 && this.profile) firstCached = this.profile.indexOf(1);
    this.drawStrip(reach);
    this.summary.replaceChildren(
      h("span", { title: "free blocks: cached + empty" }, "free ", h("b", { id: "lru-free" }, int(free))),
      h("span", { title: explain("cached") }, "cached ", h("b", null, int(cached))),
      h("span", { title: explain("alloc/s") }, "alloc ", h("b", { id: "lru-rate" }, `${rate(this.rate)}/s`)),
      h(
        "span",
        { title: explain("first cached") },
        "first cached ",
        // a queue position, written "pos N" (block ids are written #N)
        h("b", { id: "lru-first" }, firstCached >= 0 ? `pos ${int(firstCached)} · ~${dur(this.eta(firstCached))}` : "—"),
      ),
      h(
        "span",
        { class: risk.length ? "warn" : "", title: explain("evicted within") },
        `evicted within ${this.horizon}s `,
        h("b", { id: "lru-risk" }, int(risk.length)),
      ),
    );
    this.renderPrefixes(risk);
    this.renderList(head.slice(0, LIST_ROWS), reach);
  }

  /** @param {number} reach the queue positions reused within the horizon */
  drawStrip(reach) {
    const c = this.strip;
    const w = c.clientWidth;
    const hgt = c.clientHeight;
    if (c.width !== w) c.width = w;
    if (c.height !== hgt) c.height = hgt;
    const ctx = this.sctx;
    ctx.fillStyle = rgbCss(COLORS.background);
    ctx.fillRect(0, 0, w, hgt);
    const prof = this.profile;
    if (!prof || !prof.length) return;
    const per = prof.length / w;
    const cachedCol = COLORS.cached;
    const emptyCol = [70, 80, 96];
    for (let x = 0; x < w; x++) {
      const a = Math.floor(x * per);
      const b = Math.max(a + 1, Math.floor((x + 1) * per));
      let c1 = 0;
      for (let i = a; i < b && i < prof.length; i++) c1 += prof[i];
      const f = c1 / (b - a);
      const col = emptyCol.map((e, i) => Math.round(e + (cachedCol[i] - e) * f));
      ctx.fillStyle = rgbCss(col);
      ctx.fillRect(x, 0, 1, hgt);
    }
    if (reach > 0) {
      const x = Math.min(w - 1, reach / per);
      ctx.fillStyle = "rgba(240, 136, 62, 0.35)";
      ctx.fillRect(0, 0, x, hgt);
      ctx.fillStyle = rgbCss(COLORS.risk);
      ctx.fillRect(x, 0, 2, hgt);
    }
  }

  /** @param {number[]} risk the cached blocks due for eviction within the horizon */
  renderPrefixes(risk) {
    const m = this.model;
    /** @type {Map<string, {root: string, blocks: number}>} */
    const groups = new Map();
    for (const id of risk) {
      const hx = hex64(m.hash64[2 * id], m.hash64[2 * id + 1]);
      const root = this.tree.rootOf(hx);
      const g = groups.get(root) || { root, blocks: 0 };
      g.blocks++;
      groups.set(root, g);
    }
    const top = [...groups.values()].sort((a, b) => b.blocks - a.blocks).slice(0, 6);
    this.prefixes.replaceChildren(
      ...(top.length
        ? [
            h("span", { class: "muted" }, `${groups.size} prefix${groups.size === 1 ? "" : "es"} losing blocks: `),
            ...top.map((g) => h("span", { class: "chip risk", title: `chain root ${g.root}` }, `${shortHash(g.root)} ×${g.blocks}`)),
          ]
        : [h("span", { class: "muted" }, "no cached prefix is due for eviction within the horizon")]),
    );
  }

  /**
   * @param {number[]} head the queue's first ids
   * @param {number} reach
   */
  renderList(head, reach) {
    const m = this.model;
    const rows = head.map((id, pos) => {
      const cached = m.state[id] === CACHED;
      const atRisk = cached && pos < reach;
      const hx = m.hashed[id] ? hex64(m.hash64[2 * id], m.hash64[2 * id + 1]) : "";
      return h(
        "tr",
        { class: atRisk ? "risk" : cached ? "cached" : "", onclick: () => this.onSelect(id) },
        h("td", { class: "num" }, String(pos)),
        h("td", { class: "num" }, `#${id}`),
        h("td", null, h("span", { class: `dot st-${cached ? "cached" : "empty"}` }), cached ? "cached" : "empty"),
        h("td", { class: "mono" }, hx ? shortHash(hx, 12) : ""),
        h("td", { class: "num" }, `~${dur(this.eta(pos))}`),
      );
    });
    this.body.replaceChildren(...rows);
    setText($("lru-count"), `head ${head.length} of ${int(m.header.num_free_blocks ?? 0)}`);
  }
}
