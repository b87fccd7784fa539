// @ts-check
// What a bigger cache or another free order would buy: the shadow pools'
// hit-rate curve, its what-if lines and table, from REST every few seconds.

import { buildCurve, factorLabel, policyRgb, whatIf } from "../../state/whatif.js";
import { quiet, swatch } from "./analysisparts.js";
import { $, h, setText } from "../../../common/dom.js";
import { clockText, int, pct } from "../../../common/format.js";
import { MiniChart } from "../../render/minichart.js";

const pctFmt = (v) => `${Math.round(v * 100)}%`;
/** up, down or `flat` by a hit-rate delta (half a tenth of a point counts). */
const trend = (delta, flat) => (delta > 0.0005 ? "up" : delta < -0.0005 ? "down" : flat);

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

  /** The loaded trace's gap between LRU and the offline optimum (GET /api/trace). */
  async _bound() {
    let st = null;
    try {
      st = await quiet("/api/trace");
    } catch {
      return;
    }
    const b = st && st.loaded ? st.bound : null;
    if (!b) return;
    const gap = b.optimal_hit_rate - b.lru_hit_rate;
    const text =
      `Trace ${st.name}, one request at a time on ${int(b.blocks)} blocks: LRU ${pct(b.lru_hit_rate)}, ` +
      `the offline optimum ${pct(b.optimal_hit_rate)} (gap ${(gap * 100).toFixed(1)} pt), unbounded ${pct(b.unbounded_hit_rate)}.`;
    this.text.append(h("li", { class: trend(gap, "same"), "data-kind": "bound", "data-policy": "optimal", "data-factor": "1" }, text));
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
    const realRate = curve.real ? curve.real.hit_rate : undefined; // none before the real pool's first query
    const marks = realRate !== undefined ? [{ x: 1, y: realRate, rgb: [230, 237, 243], label: `real ${pct(realRate)}` }] : [];
    chart.setData(xs, ys, marks);
    // a mirror's shadows: fed from its engine's requests, in the engine's free order
    const fed = d.fed || null;
    const own = fed && fed.free_order ? fed.free_order : "append_all";
    const lines = whatIf(curve, own);
    this.text.replaceChildren(
      ...lines.map((l) =>
        h("li", { class: l.kind === "base" ? "base" : trend(l.delta, "same"), "data-kind": l.kind, "data-policy": l.policy, "data-factor": String(l.factor) }, l.text),
      ),
    );
    await this._bound();
    const base = (curve.policies.find((p) => p.policy === own)?.points || []).find((p) => p.factor === 1);
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
            h("td", { class: `num ${trend(delta, "")}` }, delta === null || q === base ? "—" : `${delta >= 0 ? "+" : "−"}${Math.abs(delta * 100).toFixed(1)}`),
            h("td", { class: "num" }, q.evictions === null || q.evictions === undefined ? "—" : int(q.evictions)),
          ),
        );
      }
    });
    this.body.replaceChildren(...rows);
    const since = d.since ? clockText(d.since) : "—";
    const how = fed ? `${fed.text} (${fed.blocks}) · ` : "";
    this.foot.title = fed ? `not fed: ${int(fed.not_fed.skips_cache)} skipping the prefix cache, ${int(fed.not_fed.not_heard)} first scheduled before the mirror heard them, ${int(fed.not_fed.forgotten)} let go` : "";
    setText(
      this.foot,
      `${how}same requests since ${since} · real pool ${curve.real ? pct(curve.real.hit_rate) : "—"} over that span · shadows lag ${int(d.lag_accesses ?? 0)} accesses${d.error ? ` · error: ${d.error}` : ""}`,
    );
  }
}
