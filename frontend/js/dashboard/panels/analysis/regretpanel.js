// @ts-check
// What eviction cost: evictions and regrets over the window (stream), and
// from REST every few seconds the eviction-to-re-store gap histogram and the
// most regretted prefixes.

import { MIRROR_WHY, onMirror, unknownEl } from "../unknown.js";
import { REASON_RGB } from "../../state/missreasons.js";
import { freshWindow, histChart, quiet, timeColumns } from "./analysisparts.js";
import { $, h, setText } from "../../../common/dom.js";
import { compact, dur, int, pct, rate } from "../../../common/format.js";
import { MiniChart } from "../../render/minichart.js";

export class RegretPanel {
  /**
   * @param {import("../../state/analysishub.js").AnalysisHub} hub
   * @param {HTMLElement} windowSel the charts' window select
   */
  constructor(hub, windowSel) {
    this.hub = hub;
    this.windowSel = windowSel;
    this.version = -1;
    /** @type {((rid: string) => void) | null} the page's request story (set by main.js) */
    this.onStory = null;
    this.chart = new MiniChart($("chart-regret"), {
      height: 100,
      x: "time",
      y: { fmt: compact },
      y2: { fmt: compact, rgb: REASON_RGB.evicted },
      empty: "waiting for two analysis reports…",
      series: [
        { label: "evictions/s", rgb: [240, 136, 62], fill: 0.25 },
        { label: "regrets/s", rgb: REASON_RGB.evicted, axis: 2, width: 1.5 },
      ],
    });
    this.gap = histChart($("chart-regret-gap"), REASON_RGB.evicted, "s", 60);
    this.summary = $("regret-summary");
    this.gapTitle = $("regret-gap-title");
    this.body = $("regret-body");
  }

  update() {
    const s = this.hub.series;
    const pts = freshWindow(this, s);
    if (!pts) return;
    const { x, ys } = timeColumns(pts, ["evictions", "regrets"]);
    this.chart.setData(x, ys);
    const sec = s.last;
    if (!sec) return;
    const ratio = sec.evictions ? sec.regrets / sec.evictions : null;
    this.summary.replaceChildren(
      h("span", { title: "hashes stored again after their eviction, of all evictions (reuse and the evict operation; a prefix-cache reset's drops are not evictions): the share of evictions that cost a recompute" }, "regrets ", h("b", { id: "regret-total" }, int(sec.regrets)), ` of ${int(sec.evictions)} evictions (${pct(ratio)})`),
      h("span", { title: "over the last minute: regrets per second against evictions per second" }, "last min ", h("b", null, rate(sec.regrets_per_s)), "/s vs ", h("b", null, rate(sec.evictions_per_s)), " evictions/s"),
      h("span", { title: "time from an eviction to the hash being stored again: median (p50) and 90th percentile (p90), as histogram bucket bounds" }, "gap p50 ", h("b", null, dur(sec.regret_gap_p50)), " p90 ", h("b", null, dur(sec.regret_gap_p90))),
    );
  }

  /**
   * A request id that opens its story (set `onStory`); none: "not known"
   * with why on hover (`why`: the server's reason).
   * @param {string | null | undefined} rid
   * @param {string | null} [why]
   */
  storyLink(rid, why = null) {
    if (!rid) return unknownEl(why || (onMirror() ? MIRROR_WHY.owners : "the analysis kept no request for it"), "not known");
    return h("a", { href: "#", "data-story": rid, onclick: (/** @type {MouseEvent} */ ev) => (ev.preventDefault(), this.onStory && this.onStory(rid)) }, rid);
  }

  async poll() {
    try {
      const d = await quiet("/api/regret?limit=12");
      this.gap.set(d.gap_seconds);
      setText(this.gapTitle, `gap between eviction and re-store · n=${int(d.gap_seconds.count)}`);
      const rows = (d.top_prefixes || []).map((r) =>
        h(
          "tr",
          { "data-root": r.root, title: `first tokens ${r.first_tokens.join(" ")}\nroot ${r.root} · deepest block ${r.deepest_block}${r.lora_name ? ` · lora ${r.lora_name}` : ""}${r.cache_salt ? ` · salt ${r.cache_salt}` : ""}` },
          h("td", { class: "mono toks" }, r.first_tokens.length ? `${r.first_tokens.slice(0, 4).join(" ")}${r.first_tokens.length > 4 ? " …" : ""}` : r.root),
          h("td", { class: "num" }, int(r.regrets)),
          h("td", { class: "num" }, dur(r.mean_gap_seconds)),
          h("td", { class: "mono" }, this.storyLink(r.owner_request, d.requests_reason), h("span", { class: "muted" }, " → "), this.storyLink(r.last_request, d.requests_reason)),
        ),
      );
      if (!rows.length) rows.push(h("tr", { class: "empty" }, h("td", { colspan: 4, class: "muted" }, "no regretted prefix yet")));
      this.body.replaceChildren(...rows);
    } catch (err) {
      setText(this.gapTitle, `GET /api/regret: ${err.message}`);
    }
  }
}
