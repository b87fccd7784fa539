// @ts-check
// The analysis row as the page opens: every panel asks REST at once (not
// after the stream's first reports and a cadence), says "loading…" until
// its answer came, and the charts get the server's recent history
// (GET /api/analysis/recent) before the stream's sections.

import { quiet } from "./analysisparts.js";
import { h } from "../../../common/dom.js";
import { seedSeries, seedTokens } from "../../state/analysisseed.js";

const LOADING = "loading…";

export class AnalysisLoader {
  /**
   * `panels`: {misses, regret, whatif, tokens} (the analysis row's panels).
   * @param {import("../../state/model.js").PoolModel} model
   * @param {import("../../state/analysishub.js").AnalysisHub} hub
   * @param {{misses: import("./misspanel.js").MissPanel, regret: import("./regretpanel.js").RegretPanel, whatif: import("./whatifpanel.js").WhatIfPanel, tokens: import("./tokenpanel.js").TokenPanel}} panels
   */
  constructor(model, hub, panels) {
    this.hub = hub;
    this.panels = panels;
    /** @type {import("../../state/analysis.js").AnalysisSection[]} the stream's sections before the history came */
    this.early = [];
    this.seeded = false;
    /** @type {Record<string, string>} part -> "loading" | "ok" | error text */
    this.state = {};
    this.seededCount = 0;
    const take = (/** @type {import("../../wire/protocol.js").Frame} */ frame) => {
      const sec = frame.header.analysis;
      if (this.seeded || !sec) return;
      const last = this.early[this.early.length - 1];
      if (!last || last.ts !== sec.ts) this.early.push(sec);
    };
    model.on("snapshot", take);
    model.on("delta", take);
  }

  /** Charts say "loading…" until their part answered (not "none yet", "waiting…"),
   * even when the stream drew its first points under it meanwhile.
   * @param {({setLoading: (text: string | null) => void} | null | undefined)[]} charts
   * @param {boolean} on
   */
  _loading(charts, on) {
    for (const c of charts) if (c) c.setLoading(on ? LOADING : null);
  }

  /**
   * @param {string} name
   * @param {({setLoading: (text: string | null) => void} | null | undefined)[]} charts
   * @param {() => Promise<unknown>} fn
   */
  async _part(name, charts, fn) {
    this.state[name] = "loading";
    this._loading(charts, true);
    try {
      await fn();
      this.state[name] = "ok";
    } catch (err) {
      this.state[name] = err.message || String(err);
    } finally {
      this._loading(charts, false);
    }
  }

  async _recent() {
    this.panels.misses.loading = true; // it would say "waiting for two analysis reports…"
    try {
      const d = await quiet("/api/analysis/recent?seconds=900");
      // the analysis runs: show its row even when the stream's snapshot came
      // before the worker's first report (the snapshot then said "off")
      if (d.enabled) document.body.dataset.analysis = "on";
      const secs = d.sections || [];
      this.seededCount = seedSeries(this.hub.series, secs, this.early);
      seedTokens(this.hub.tokens, secs);
    } finally {
      this.seeded = true;
      this.early = [];
      this.panels.misses.loading = false;
    }
  }

  /** Ask everything once, now; resolves when every part answered (or failed). */
  async start() {
    const p = this.panels;
    document.body.dataset.analysisLoading = "1";
    // tables the REST answers fill: "loading…" until then (a poll replaces it)
    const row = (/** @type {number} */ cols) => h("tr", { class: "empty loading" }, h("td", { colspan: cols, class: "muted" }, LOADING));
    p.regret.body.replaceChildren(row(4));
    p.misses.recentBody.replaceChildren(row(4));
    p.whatif.text.replaceChildren(h("li", { class: "loading muted" }, LOADING));
    await Promise.all([
      this._part("recent", [p.misses.chart, p.regret.chart, p.tokens.chart], () => this._recent()),
      // the panels' poll() catch their own errors and show them in place
      this._part("misses", [p.misses.ago.chart, p.misses.pos.chart], () => p.misses.poll()),
      this._part("regret", [p.regret.gap.chart], () => p.regret.poll()),
      this._part("shadows", [], () => p.whatif.poll()),
    ]);
    document.body.dataset.analysisLoading = "0";
    p.misses.update();
    p.regret.update();
    p.tokens.update();
  }
}
