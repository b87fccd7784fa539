// @ts-check
// Stream health, always visible: connection state, seq, lag, drops,
// resyncs, reconnects, gaps resumed, throughput and the render rate.

import { $, h, setText } from "../../common/dom.js";
import { bytes, int } from "../../common/format.js";
import { explain } from "../../common/terms.js";

export class HealthBar {
  /**
   * @param {import("../wire/stream.js").StreamConnection} conn
   * @param {import("../state/model.js").PoolModel} model
   * @param {{raf: number, map: {lastMs: number, maxMs: number} | null}} perf the page's frame count and the map's draw times (main.js)
   */
  constructor(conn, model, perf) {
    this.conn = conn;
    this.model = model;
    this.perf = perf;
    this.root = $("health");
    /** @type {{t: number, frames: number, bytes: number, raf?: number}} the figures at the last rate update */
    this.prev = { t: performance.now(), frames: 0, bytes: 0 };
    this.fps = 0;
    this.bps = 0;
    this.framesPs = 0;
    this.everLive = false; // the stream was live once (a loss after that is an error)
    /** @type {Record<string, HTMLElement>} */
    this.cells = {};
    const items = [
      ["state", "stream"],
      ["seq", "seq"],
      ["lag", "frame lag"],
      ["drops", "drops"],
      ["resyncs", "resyncs"],
      ["reconnects", "reconnects"],
      ["gaps", "gaps"],
      ["rate", "in"],
      ["fps", "fps"],
    ];
    for (const [key, label] of items) {
      const v = h("b", { id: `h-${key}` }, "—");
      this.cells[key] = v;
      this.root.append(h("span", { class: "hitem", "data-h": key, title: explain(label) }, h("i", null, label), v));
    }
  }

  /** @param {number} now performance.now() */
  update(now) {
    const c = this.conn.health;
    const m = this.model;
    const dt = (now - this.prev.t) / 1000;
    if (dt >= 1) {
      this.fps = (this.perf.raf - (this.prev.raf || 0)) / dt;
      this.bps = (c.bytes - this.prev.bytes) / dt;
      this.framesPs = (c.frames - this.prev.frames) / dt;
      this.prev = { t: now, frames: c.frames, bytes: c.bytes, raf: this.perf.raf };
    }
    const cell = this.cells;
    let state = c.state;
    let label = state;
    if (state === "open") label = m.seq === null ? "syncing" : "live";
    // a mirror whose engine tells nothing new: the page is stale, not live (mirroritem.js)
    const engineStale = document.body.dataset.engine === "stale";
    if (state === "open" && engineStale) label = "stale (engine)";
    if (state === "retrying") label = `retry in ${Math.max(0, (c.nextRetryAt - now) / 1000).toFixed(1)}s`;
    if (state === "auth") label = "token needed";
    if (state === "open" && m.seq === null) state = "syncing";
    if (state === "open") this.everLive = true;
    // the first connection of the page is loading, not an error: no warning
    // banner, no greyed panels until a stream that was live is lost
    const first = !this.everLive && (state === "syncing" || state === "connecting" || state === "idle");
    setText(cell.state, first && label !== "syncing" ? "connecting" : label);
    this.root.dataset.state = state === "open" && engineStale ? "engine-stale" : state;
    const mode = document.getElementById("tl-mode"); // time travel's live mark (its history mark stays)
    if (mode && mode.dataset.mode === "live") {
      const want = engineStale ? "stale" : "live";
      if (mode.textContent !== want) mode.textContent = want;
      mode.dataset.engine = engineStale ? "stale" : "live";
    }
    document.body.dataset.stream = state === "open" ? "live" : first ? "loading" : state;
    const banner = document.getElementById("stale-banner");
    if (banner) {
      const age = c.lastFrameAt ? ((now - c.lastFrameAt) / 1000).toFixed(0) : "?";
      setText(
        banner,
        first
          ? "Loading the pool…"
          : state === "auth"
          ? "The stream needs a token: enter it at the top right."
          : `Stream ${state === "syncing" ? "resyncing" : "disconnected"}: showing the pool as of seq ${m.seq ?? "—"} (${age} s ago) · ${label}`,
      );
    }
    setText(cell.seq, m.seq === null ? "—" : int(m.seq));
    setText(cell.lag, c.lagMs === null ? "—" : `${int(c.lagMs)}ms`);
    cell.lag.title = "frame lag: the server's tick to this page (the stream), for the latest frame";
    /** @type {Partial<import("../wire/protocol.js").StreamStats>} */
    const server = c.server || {};
    setText(cell.drops, int(server.drops_total ?? 0));
    cell.drops.title = "frames the server dropped for slow clients (all clients)";
    setText(cell.resyncs, `${int(c.resyncs)} / ${int(server.resyncs_total ?? 0)}`);
    cell.resyncs.title = "snapshots this page needed after the first of a connection / server total";
    setText(cell.reconnects, int(c.reconnects));
    setText(cell.gaps, int(c.gapsResumed));
    cell.gaps.title = "gaps detected and resumed from the ring";
    setText(cell.rate, `${(this.framesPs || 0).toFixed(0)}/s · ${bytes(this.bps || 0)}/s`);
    setText(cell.fps, this.fps.toFixed(0));
    // the figures a narrow top bar leaves out, on the stream item's hover
    const stateItem = cell.state.parentElement;
    if (stateItem) {
      stateItem.title = `${explain("stream")}\n\nseq ${m.seq === null ? "—" : int(m.seq)} · drops ${int(server.drops_total ?? 0)} · reconnects ${int(c.reconnects)} · gaps resumed ${int(c.gapsResumed)} · in ${(this.framesPs || 0).toFixed(0)} frames/s, ${bytes(this.bps || 0)}/s · ${this.fps.toFixed(0)} fps`;
    }
    const mp = this.perf.map; // set before the bar exists (main.js)
    if (mp) cell.fps.title = `map draw: last ${mp.lastMs.toFixed(2)} ms, max ${mp.maxMs.toFixed(1)} ms`;
  }
}
