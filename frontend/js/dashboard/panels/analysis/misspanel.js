// @ts-check
// Why prompts missed: miss rates by reason over the window (stream), the
// totals table, and from REST every few seconds the evicted misses' age and
// queue-position histograms and the recent requests.

import { missColumns } from "../../state/analysis.js";
import { REASONS, REASON_HELP, REASON_LABEL, REASON_RGB } from "../../state/missreasons.js";
import { freshWindow, histChart, quiet, swatch } from "./analysisparts.js";
import { $, h, setText } from "../../../common/dom.js";
import { clockText, compact, dur, int, pct, rate } from "../../../common/format.js";
import { rgba } from "../../../common/palette.js";
import { MiniChart } from "../../render/minichart.js";

/** @typedef {{rate: HTMLElement, blocks: HTMLElement, tokens: HTMLElement, bar: HTMLElement, share: HTMLElement}} ReasonCells one reason's row */

export class MissPanel {
  /**
   * @param {import("../../state/analysishub.js").AnalysisHub} hub
   * @param {HTMLElement} windowSel the charts' window select
   * @param {(rid: string) => void} showRequest a recent request's detail
   */
  constructor(hub, windowSel, showRequest) {
    this.hub = hub;
    this.windowSel = windowSel;
    this.showRequest = showRequest;
    this.unitSel = $("miss-unit", HTMLSelectElement);
    this.version = -1;
    this.loading = false; // the first REST answer is pending (AnalysisLoader): no "waiting for…" yet
    this.hoverIdx = null;
    this.chart = new MiniChart($("chart-misses"), {
      height: 112,
      x: "time",
      legend: false,
      empty: "waiting for two analysis reports…",
      series: REASONS.map((r) => ({ label: REASON_LABEL[r], rgb: REASON_RGB[r], stack: true, fill: 0.6 })),
      onhover: (i) => {
        this.hoverIdx = i;
        this.renderTable();
      },
    });
    /** @type {Record<string, ReasonCells>} */
    this.rows = {};
    const body = $("miss-body");
    for (const r of REASONS) {
      const cells = {
        rate: h("td", { class: "num" }, "—"),
        blocks: h("td", { class: "num", "data-reason": r }, "—"),
        tokens: h("td", { class: "num" }, "—"),
        bar: h("span", { class: "share-bar", style: `background:${rgba(REASON_RGB[r], 0.8)}` }),
        share: h("span", { class: "share-num" }, ""),
      };
      body.append(
        h(
          "tr",
          { "data-reason": r, title: REASON_HELP[r] },
          h("td", null, swatch(REASON_RGB[r]), REASON_LABEL[r]),
          cells.rate,
          cells.blocks,
          cells.tokens,
          h("td", { class: "share" }, cells.bar, cells.share),
        ),
      );
      this.rows[r] = cells;
    }
    this.foot = $("miss-foot");
    this.rateHead = $("miss-rate-head");
    this.ago = histChart($("chart-miss-ago"), REASON_RGB.evicted, "s");
    this.pos = histChart($("chart-miss-pos"), [121, 192, 255], "n");
    this.agoTitle = $("miss-ago-title");
    this.posTitle = $("miss-pos-title");
    this.recentBody = $("miss-recent");
    this.unitSel.addEventListener("change", () => {
      this.version = -1;
      this.update();
    });
    /** @type {import("../../state/analysis.js").AnalysisPoint[] | null} the points last drawn */
    this.pts = null;
    this.rest = null;
    this.error = "";
  }

  update() {
    const s = this.hub.series;
    const pts = freshWindow(this, s);
    if (!pts) return;
    if (!this.loading) this.chart.o.empty = s.last ? "waiting for two analysis reports…" : "no analysis on the stream yet (off on this server?)";
    const { x, ys } = missColumns(pts, { tokens: this.unitSel.value === "tokens" });
    this.pts = pts;
    this.chart.setData(x, ys);
    this.renderTable();
  }

  renderTable() {
    const tot = this.hub.series.totals();
    const tokens = this.unitSel.value === "tokens";
    const pts = this.pts || [];
    const idx = this.hoverIdx === null ? pts.length - 1 : this.hoverIdx;
    const pt = idx >= 0 ? pts[idx] : null;
    setText(this.rateHead, this.hoverIdx === null ? (tokens ? "tok/s" : "blk/s") : `@${clockText(pt.ts)}`);
    for (const r of REASONS) {
      const c = this.rows[r];
      const v = pt ? (tokens ? pt.missTokens[r] : pt.misses[r]) : null;
      setText(c.rate, rate(v));
      if (!tot) continue;
      const t = tot.reasons[r];
      setText(c.blocks, int(t.blocks));
      c.blocks.dataset.value = String(t.blocks);
      setText(c.tokens, int(t.tokens));
      const share = tokens ? (tot.missedTokens ? t.tokens / tot.missedTokens : 0) : t.share;
      c.bar.style.width = `${Math.round(share * 60)}px`;
      setText(c.share, pct(share, 0));
    }
    if (tot) {
      const all = tot.missed + tot.hit;
      setText(
        this.foot,
        `${int(tot.missed)} prompt blocks missed, ${int(tot.hit)} hit (${pct(all ? tot.hit / all : null)} of ${int(all)})`,
      );
      this.foot.dataset.missed = String(tot.missed);
    }
  }

  async poll() {
    try {
      const d = await quiet("/api/misses?limit=30");
      this.rest = d;
      this.error = "";
      const em = d.evicted_misses || {};
      this.ago.set(em.ago_seconds);
      this.pos.set(em.queue_position_when_freed);
      const q = (/** @type {{count: number, p50: number, p90: number} | null | undefined} */ hg, /** @type {(v: number) => string} */ f) => (hg && hg.count ? `p50 ${f(hg.p50)} p90 ${f(hg.p90)}` : "none yet");
      setText(this.agoTitle, `age ${q(em.ago_seconds, dur)}`);
      this.agoTitle.title = "how long before the miss its hash had been evicted";
      setText(this.posTitle, `queue pos. ${q(em.queue_position_when_freed, compact)}`);
      this.posTitle.title = "where the evicted block had entered the free queue (0 = head): how far it travelled before eviction";
      this.renderRecent(d.recent_requests || []);
    } catch (err) {
      this.error = err.message;
      setText(this.agoTitle, `GET /api/misses: ${err.message}`);
    }
  }

  /** @param {{request_id: string, misses?: Record<string, number>, num_prompt_blocks: number, num_hit_blocks: number, finished?: boolean}[]} items GET /api/misses recent_requests */
  renderRecent(items) {
    const rows = items.slice(0, 30).map((r) => {
      const m = r.misses || {};
      const total = Math.max(1, r.num_prompt_blocks);
      const segs = [h("span", { class: "seg", style: `width:${(100 * r.num_hit_blocks) / total}%;background:${rgba(REASON_RGB.hit)}` })];
      for (const reason of REASONS) {
        if (m[reason]) segs.push(h("span", { class: "seg", style: `width:${(100 * m[reason]) / total}%;background:${rgba(REASON_RGB[reason])}` }));
      }
      const top = Object.entries(m).sort((a, b) => b[1] - a[1])[0];
      return h(
        "tr",
        { "data-rid": r.request_id, onclick: () => this.showRequest(r.request_id), title: "show its blocks in the detail panel" },
        h("td", { class: "mono" }, r.request_id, r.finished ? h("span", { class: "muted" }, " ✓") : ""),
        h("td", { class: "num" }, int(r.num_prompt_blocks)),
        h("td", null, h("span", { class: "mini-stack" }, ...segs)),
        h("td", { class: "muted" }, top ? `${REASON_LABEL[top[0]]} ${top[1]}` : "all hit"),
      );
    });
    this.recentBody.replaceChildren(...rows);
  }
}
