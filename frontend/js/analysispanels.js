// The analysis panels: why prompts missed, what eviction cost (regret),
// what a bigger cache or another free order would buy (what-if), token
// usage beside block usage, and the analysis health in the top bar.
//
// Live figures come from the stream (`analysis` about once a second,
// `tokens` in every frame); the rest (histograms, top prefixes, the curve,
// recent requests) from REST every few seconds, quietly: a failure shows in
// its panel, not in the page's error line.

import { api } from "./api.js";
import {
  AnalysisSeries,
  REASONS,
  REASON_HELP,
  REASON_LABEL,
  REASON_RGB,
  TokenSeries,
  analysisHealth,
  buildCurve,
  factorLabel,
  missColumns,
  policyRgb,
  trimHistogram,
  whatIf,
} from "./analysis.js";
import { $, dur, h, int, pct, setText } from "./format.js";
import { MiniChart, compact, rgba } from "./minichart.js";

const quiet = (path) => api("GET", path, undefined, { quiet: true });
const pctFmt = (v) => `${Math.round(v * 100)}%`;
const rateFmt = (v) => (v === null || v === undefined || !Number.isFinite(v) ? "—" : v >= 100 ? int(v) : v.toFixed(1));
const boundLabel = (b, unit) => (b === "+Inf" ? "more" : unit === "s" ? `≤${dur(b)}` : `≤${compact(b)}`);

function swatch(rgb) {
  return h("i", { class: "sw-dot", style: `background:${rgba(rgb)}` });
}

/** A small bar histogram (MiniChart: uPlot bars) over trimmed buckets. */
function histChart(el, rgb, unit, height = 64) {
  const chart = new MiniChart(el, {
    height,
    x: "cat",
    legend: false,
    yWidth: 30,
    empty: "none yet",
    xFmt: (b) => boundLabel(b, unit),
    series: [{ label: "count", rgb, bars: true, fill: 0.75 }],
  });
  return {
    chart,
    key: "",
    set(hg) {
      const key = hg ? `${hg.count}/${hg.sum}` : "";
      if (key === this.key) return;
      this.key = key;
      if (!hg || !hg.count) {
        chart.setData([], [[]]);
        return;
      }
      const t = trimHistogram(hg);
      chart.setData(t.bounds, [t.counts]);
    },
  };
}

// ------------------------------------------------------------ the hub

/** Holds the series; every panel reads from here. */
export class AnalysisHub {
  constructor(model) {
    this.model = model;
    this.series = new AnalysisSeries();
    this.tokens = new TokenSeries();
    this.section = null;
    this.movedAt = 0; // performance.now() when the section's ts last changed
    this.firstAt = 0; // when this server's first section came
    this.activityAt = 0; // when the pool last changed (a delta with blocks or events)
    this.resyncs0 = undefined;
    model.on("config", (frame) => {
      if (this.epoch !== undefined && frame.header.epoch !== this.epoch) this.clear();
      this.epoch = frame.header.epoch;
    });
    model.on("snapshot", (frame) => {
      const hd = frame.header;
      const series = hd.series || [];
      this.tokens.ingest(series.length ? series[series.length - 1].ts : Date.now() / 1000, hd.tokens);
      this.take(hd.analysis);
      // a snapshot always carries the section when the analysis runs
      document.body.dataset.analysis = hd.analysis ? "on" : "off";
    });
    model.on("delta", (frame) => {
      const hd = frame.header;
      if (hd.tokens) this.tokens.ingest(hd.ts, hd.tokens);
      const ids = frame.columns && frame.columns.ids;
      if ((ids && ids.length) || (hd.events && hd.events.length)) this.activityAt = performance.now();
      if (hd.analysis) this.take(hd.analysis);
    });
  }

  clear() {
    this.series.clear();
    this.tokens.clear();
    this.section = null;
    this.resyncs0 = undefined;
  }

  take(section) {
    if (!section) return;
    if (!this.section) this.firstAt = performance.now();
    if (!this.section || section.ts !== this.section.ts) this.movedAt = performance.now();
    this.section = section;
    if (this.resyncs0 === undefined && section.worker) this.resyncs0 = section.worker.resyncs;
    this.series.ingest(section);
  }

  /**
   * An idle worker does not report (its section keeps its ts): the report
   * is stale only when the pool has been changing since it last moved.
   */
  health(now = performance.now()) {
    const stale = this.section && this.activityAt - this.movedAt > 1000 && now - this.movedAt > 5000;
    return analysisHealth(this.section, {
      sinceMoveS: stale ? (now - this.movedAt) / 1000 : undefined,
      resyncs0: this.resyncs0,
    });
  }
}

// ------------------------------------------------------ health (top bar)

export class AnalysisHealthItem {
  constructor(hub) {
    this.hub = hub;
    this.value = h("b", { id: "h-analysis" }, "—");
    this.item = h("span", { class: "hitem", "data-h": "analysis" }, h("i", null, "analysis"), this.value);
    $("health").append(this.item);
  }

  update(now) {
    const st = this.hub.health(now);
    setText(this.value, st.text);
    this.item.dataset.level = st.level;
    this.item.title = st.title;
  }
}

// ------------------------------------------------------------- tokens

export class TokenPanel {
  constructor(hub, windowSel) {
    this.hub = hub;
    this.windowSel = windowSel;
    this.version = -1;
    this.chart = new MiniChart($("chart-tokens"), {
      height: 128,
      x: "time",
      y: { fmt: compact },
      y2: { fmt: compact, rgb: REASON_RGB.chain_broken },
      series: [
        { label: "slots reserved", rgb: [88, 166, 255], width: 1, dash: [4, 3] },
        { label: "held", rgb: [31, 111, 235], fill: 0.55 },
        { label: "tail waste", rgb: REASON_RGB.chain_broken, axis: 2, width: 1.25 },
      ],
      empty: "no token figures on the stream",
    });
    this.note = $("tokens-note");
  }

  update() {
    const t = this.hub.tokens;
    if (t.version === this.version) return;
    this.version = t.version;
    const span = Number(this.windowSel.value) || 120;
    const pts = t.window(span);
    this.chart.setData(
      pts.map((p) => p.ts),
      [pts.map((p) => p.reserved), pts.map((p) => p.held), pts.map((p) => p.waste)],
    );
    const k = t.latest;
    if (k) {
      setText(
        this.note,
        `${pct(k.usage_ratio)} of ${compact(k.capacity)} slots hold tokens · reserved ${pct(k.fill_ratio)} full`,
      );
      this.note.dataset.held = String(k.held);
      this.note.dataset.reserved = String(k.slots_reserved);
    }
  }
}

// ------------------------------------------------------------- misses

export class MissPanel {
  constructor(hub, windowSel, showRequest) {
    this.hub = hub;
    this.windowSel = windowSel;
    this.showRequest = showRequest;
    this.unitSel = $("miss-unit");
    this.version = -1;
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
    this.rest = null;
    this.error = "";
  }

  update() {
    const s = this.hub.series;
    if (s.version === this.version) return;
    this.version = s.version;
    const span = Number(this.windowSel.value) || 120;
    const pts = s.window(span);
    this.chart.o.empty = s.last ? "waiting for two analysis reports…" : "no analysis on the stream yet (off on this server?)";
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
    setText(this.rateHead, this.hoverIdx === null ? (tokens ? "tok/s" : "blk/s") : `@${new Date(pt.ts * 1000).toTimeString().slice(0, 8)}`);
    for (const r of REASONS) {
      const c = this.rows[r];
      const v = pt ? (tokens ? pt.missTokens[r] : pt.misses[r]) : null;
      setText(c.rate, rateFmt(v));
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
      const q = (hg, f) => (hg && hg.count ? `p50 ${f(hg.p50)} p90 ${f(hg.p90)}` : "none yet");
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

// ------------------------------------------------------------- regret

export class RegretPanel {
  constructor(hub, windowSel) {
    this.hub = hub;
    this.windowSel = windowSel;
    this.version = -1;
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
    if (s.version === this.version) return;
    this.version = s.version;
    const span = Number(this.windowSel.value) || 120;
    const pts = s.window(span);
    this.chart.setData(
      pts.map((p) => p.ts),
      [pts.map((p) => p.evictions), pts.map((p) => p.regrets)],
    );
    const sec = s.last;
    if (!sec) return;
    const ratio = sec.evictions ? sec.regrets / sec.evictions : null;
    this.summary.replaceChildren(
      h("span", null, "regrets ", h("b", { id: "regret-total" }, int(sec.regrets)), ` of ${int(sec.evictions)} evictions (${pct(ratio)})`),
      h("span", null, "last min ", h("b", null, rateFmt(sec.regrets_per_s)), "/s vs ", h("b", null, rateFmt(sec.evictions_per_s)), " evictions/s"),
      h("span", null, "gap p50 ", h("b", null, dur(sec.regret_gap_p50)), " p90 ", h("b", null, dur(sec.regret_gap_p90))),
    );
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
          h("td", { class: "mono" }, r.owner_request || "—", h("span", { class: "muted" }, " → "), r.last_request || "—"),
        ),
      );
      if (!rows.length) rows.push(h("tr", { class: "empty" }, h("td", { colspan: 4, class: "muted" }, "no regretted prefix yet")));
      this.body.replaceChildren(...rows);
    } catch (err) {
      setText(this.gapTitle, `GET /api/regret: ${err.message}`);
    }
  }
}

// ------------------------------------------------------------- what-if

export class WhatIfPanel {
  constructor(hub) {
    this.hub = hub;
    this.curve = null;
    this.chart = null;
    this.chartKey = "";
    this.text = $("whatif-text");
    this.body = $("whatif-body");
    this.foot = $("whatif-foot");
    this.el = $("chart-mrc");
  }

  _chart(policies) {
    const key = policies.map((p) => p.policy).join(",");
    if (this.chart && key === this.chartKey) return this.chart;
    if (this.chart) this.chart.destroy();
    this.el.replaceChildren();
    this.chartKey = key;
    this.chart = new MiniChart(this.el, {
      height: 130,
      x: "num",
      xLog2: true,
      xFmt: factorLabel,
      y: { fmt: pctFmt, range: (lo, hi) => [Math.max(0, Math.floor((lo - 0.03) * 20) / 20), Math.min(1, Math.ceil((hi + 0.02) * 20) / 20)] },
      empty: "no shadow pools",
      legendIdx: (xs) => Math.max(0, xs.indexOf(1)),
      series: policies.map((p, i) => ({ label: p.policy, rgb: policyRgb(p.policy, i), points: true, width: 1.5, spanGaps: true, fmt: (v) => pct(v) })),
    });
    return this.chart;
  }

  async poll() {
    let d;
    try {
      d = await quiet("/api/shadows");
    } catch (err) {
      setText(this.foot, `GET /api/shadows: ${err.message}`);
      return;
    }
    this.rest = d;
    if (!d.enabled) {
      setText(this.foot, "shadow pools are off (--shadow-mode off)");
      return;
    }
    const curve = buildCurve(d);
    this.curve = curve;
    const chart = this._chart(curve.policies);
    const xs = curve.factors;
    const ys = curve.policies.map((p) => xs.map((f) => (p.points.find((q) => q.factor === f) || { hit_rate: null }).hit_rate));
    const marks = curve.real ? [{ x: 1, y: curve.real.hit_rate, rgb: [230, 237, 243], label: `real ${pct(curve.real.hit_rate)}` }] : [];
    chart.setData(xs, ys, marks);
    const lines = whatIf(curve);
    this.text.replaceChildren(
      ...lines.map((l) =>
        h("li", { class: l.kind === "base" ? "base" : l.delta > 0.0005 ? "up" : l.delta < -0.0005 ? "down" : "same", "data-kind": l.kind, "data-policy": l.policy, "data-factor": String(l.factor) }, l.text),
      ),
    );
    const base = (curve.policies.find((p) => p.policy === "vllm016")?.points || []).find((p) => p.factor === 1);
    const rows = [];
    curve.policies.forEach((p, i) => {
      for (const q of p.points) {
        const delta = base ? q.hit_rate - base.hit_rate : null;
        rows.push(
          h(
            "tr",
            { "data-policy": p.policy, "data-factor": String(q.factor), "data-capacity": String(q.capacity) },
            h("td", null, swatch(policyRgb(p.policy, i)), p.policy),
            h("td", { class: "num" }, factorLabel(q.factor)),
            h("td", { class: "num" }, int(q.capacity)),
            h("td", { class: "num" }, pct(q.hit_rate)),
            h("td", { class: `num ${delta > 0.0005 ? "up" : delta < -0.0005 ? "down" : ""}` }, delta === null || q === base ? "—" : `${delta >= 0 ? "+" : "−"}${Math.abs(delta * 100).toFixed(1)}`),
            h("td", { class: "num" }, q.evictions === null || q.evictions === undefined ? "—" : int(q.evictions)),
          ),
        );
      }
    });
    this.body.replaceChildren(...rows);
    const since = d.since ? new Date(d.since * 1000).toTimeString().slice(0, 8) : "—";
    setText(
      this.foot,
      `same requests since ${since} · real pool ${curve.real ? pct(curve.real.hit_rate) : "—"} over that span · shadows lag ${int(d.lag_accesses ?? 0)} accesses${d.error ? ` · error: ${d.error}` : ""}`,
    );
  }
}
