// @ts-check
// The analysis hub: holds the analysis series and the token series, fed
// from the stream (`analysis` about once a second, `tokens` in every
// frame); every analysis panel reads from here.

import { AnalysisSeries, TokenSeries, analysisHealth } from "./analysis.js";

/** Holds the series; every panel reads from here. */
export class AnalysisHub {
  /** @param {import("./model.js").PoolModel} model */
  constructor(model) {
    this.model = model;
    this.series = new AnalysisSeries();
    this.tokens = new TokenSeries();
    this.section = null;
    this.movedAt = 0; // performance.now() when the section's ts last changed
    this.firstAt = 0; // when this server's first section came
    this.activityAt = 0; // when the pool last changed (a delta with blocks or events)
    this.resyncs0 = undefined;
    this.enabled = false; // the server runs the analysis (snapshot's analysis_enabled)
    /** @type {string | undefined} the config frame's epoch (undefined before the first) */
    this.epoch = undefined;
    model.on("config", (frame) => {
      if (this.epoch !== undefined && frame.header.epoch !== this.epoch) this.clear();
      this.epoch = frame.header.epoch;
    });
    model.on("snapshot", (frame) => {
      const hd = frame.header;
      const series = hd.series || [];
      this.tokens.ingest(series.length ? series[series.length - 1].ts : Date.now() / 1000, hd.tokens);
      this.take(hd.analysis);
      // the snapshot says whether the analysis runs, section or not (an idle
      // server, a worker that has not reported yet: on, waiting)
      this.enabled = Boolean(hd.analysis || hd.analysis_enabled);
      document.body.dataset.analysis = this.enabled ? "on" : "off";
    });
    model.on("delta", (frame) => {
      const hd = frame.header;
      if (hd.tokens && hd.ts !== undefined) this.tokens.ingest(hd.ts, hd.tokens); // every delta has its ts
      const ids = frame.columns && frame.columns.ids;
      if ((ids && ids.length) || (hd.events && hd.events.length)) this.activityAt = performance.now();
      if (hd.analysis) {
        this.take(hd.analysis);
        this.enabled = true;
        document.body.dataset.analysis = "on";
      }
    });
  }

  clear() {
    this.series.clear();
    this.tokens.clear();
    this.section = null;
    this.resyncs0 = undefined;
  }

  /** @param {import("./analysis.js").AnalysisSection | null | undefined} section */
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
      enabled: this.enabled,
    });
  }
}
