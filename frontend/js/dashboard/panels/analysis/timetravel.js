// @ts-check
// Time travel: a slider over the recording (GET /api/history: span and
// keyframes) under the block map.  Scrubbing renders GET
// /api/history/state?at=<seq>&include_blocks=true into the same canvas (the
// map's source is swapped; the live model keeps applying frames meanwhile),
// clearly marked as history, with a way back to live.  Two moments (A, B)
// give GET /api/history/diff as lists; the recording exports as NDJSON.

import { api, getToken } from "../../../common/api.js";
import { $, h, setText } from "../../../common/dom.js";
import { bytes, clockText, dur, int } from "../../../common/format.js";
import { HistorySource, diffRows, momentProblem, parseMoment, seqTime } from "../../state/history.js";

const quiet = (path) => api("GET", path, undefined, { quiet: true });
const QUEUE_ROWS = 120; // the recorded free queue's head the LRU panel shows

/** How far back the recording reaches (GET /api/history `horizon`). */
export function horizonText(hz) {
  if (!hz) return "horizon —";
  if (hz.full) return `holds the last ${dur(hz.seconds)} (full: older moments drop)`;
  if (hz.seconds === null || hz.seconds === undefined) return "horizon — (no operation yet)";
  return `holds ~${dur(hz.seconds)} at this rate`;
}

/**
 * What the page does around time travel (every one optional).
 * @typedef {object} TimeTravelHooks
 * @property {() => void} [onEnter] a recorded moment is shown (from live)
 * @property {() => void} [onLeave] back to live
 * @property {(state: import("../../state/history.js").HistoryState, src: HistorySource) => void} [onMoment] the panels that follow the moment shown
 * @property {(rid: string) => void} [showRequest] a request's detail
 * @property {(ids: number[]) => void} [highlight] blocks to outline on the map
 * @property {() => boolean} [visible] is the time-travel panel on screen?
 */

export class TimeTravel {
  /**
   * @param {import("../../state/model.js").PoolModel} model
   * @param {import("../../render/blockmap.js").BlockMap} map
   * @param {TimeTravelHooks} [hooks]
   */
  constructor(model, map, { onEnter, onLeave, onMoment, showRequest, highlight, visible } = {}) {
    this.model = model;
    this.map = map;
    this.onEnter = onEnter;
    this.onLeave = onLeave;
    this.onMoment = onMoment; // (state, source): the panels that follow the moment shown
    this.state = null; // the recorded moment shown (GET /api/history/state)
    this.showRequest = showRequest;
    this.highlight = highlight;
    this.visible = visible || (() => true); // is the time-travel panel on screen?
    this.info = null;
    this.error = "";
    this.jumpError = ""; // the jump box's refusal, shown until corrected
    this.mode = "live"; // live | history
    this.src = null; // HistorySource shown
    this.want = null; // seq asked for (the slider)
    this.inflight = false;
    this.gen = 0; // bumps on "back to live": answers in flight are dropped
    this.fetches = 0;
    this.marks = { a: null, b: null };
    this.pollEvery = 3000;
    this.slider = $("tl-slider", HTMLInputElement);
    this.modeEl = $("tl-mode");
    this.atEl = $("tl-at");
    this.jump = $("tl-jump", HTMLInputElement);
    this.banner = $("history-banner");
    this.marksEl = $("tl-marks");
    this.span = $("tt-span");
    this.fromIn = $("diff-from", HTMLInputElement);
    this.toIn = $("diff-to", HTMLInputElement);
    this.diffSummary = $("diff-summary");
    this.evictedBody = $("diff-evicted");
    this.enteredBody = $("diff-entered");
    this.reqsEl = $("diff-requests");
    this.exportLink = $("tt-export", HTMLAnchorElement);
    this.exportGz = $("tt-export-gz", HTMLAnchorElement);
    this.exportSize = null; // {bytes, lines, last_seq, at}: GET /api/history/export/size
    this.sizing = false;
    this._wire();
    this.render();
  }

  get active() {
    return this.mode === "history";
  }

  _wire() {
    this.slider.addEventListener("input", () => this.scrub(Number(this.slider.value)));
    $("tl-live").addEventListener("click", () => this.live());
    $("history-live").addEventListener("click", () => this.live());
    $("tl-a").addEventListener("click", () => this.mark("a"));
    $("tl-b").addEventListener("click", () => this.mark("b"));
    this.jump.addEventListener("keydown", (ev) => {
      if (ev.key === "Enter") {
        ev.preventDefault();
        this.jumpTo(this.jump.value);
      }
    });
    // a refused moment stays said until the box is corrected (a jump that
    // works) or emptied
    this.jump.addEventListener("input", () => {
      if (!this.jump.value.trim()) this._jumpOk();
    });
    for (const btn of /** @type {NodeListOf<HTMLElement>} */ (document.querySelectorAll("[data-last]"))) {
      btn.addEventListener("click", () => this.diffLast(Number(btn.dataset.last)));
    }
    $("diff-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      this.diff();
    });
    this.exportLink.addEventListener("mouseenter", () => {
      if (!this.exportSize || performance.now() - this.exportSize.at > 5000) this.measureExport();
    });
    this.exportLink.addEventListener("click", (ev) => {
      if (!getToken()) return; // a plain download; with a token, fetch it with the header
      ev.preventDefault();
      this.exportWithToken("/api/history/export", "jsonl");
    });
    this.exportGz.addEventListener("click", (ev) => {
      if (!getToken()) return;
      ev.preventDefault();
      this.exportWithToken("/api/history/export.jsonl.gz", "jsonl.gz");
    });
  }

  // ---------------------------------------------------------- recording

  async poll() {
    try {
      this.info = await quiet("/api/history");
      this.error = "";
      this.pollEvery = 3000;
      // the export's size (the JSON is several times the memory held): read
      // from the recording's counters, cheap: with every poll while on screen
      if (this.visible()) this.measureExport();
    } catch (err) {
      this.info = null;
      this.error = err.status === 409 ? err.message : `GET /api/history: ${err.message}`;
      this.pollEvery = err.status === 409 ? 30000 : 5000;
    }
    this.render();
  }

  render() {
    const info = this.info;
    const s = this.slider;
    const ok = Boolean(info && info.enabled && info.last_seq >= info.first_seq);
    s.disabled = !ok;
    for (const id of ["tl-a", "tl-b"]) $(id, HTMLButtonElement).disabled = !ok;
    this.jump.disabled = !ok;
    $("timeline").dataset.enabled = ok ? "1" : "0";
    if (!ok) {
      setText(this.atEl, this.error || "no recording");
      setText(this.span, this.error || "");
      return;
    }
    s.min = String(info.first_seq);
    s.max = String(info.last_seq);
    if (!this.active) s.value = String(info.last_seq);
    const secs = info.last_ts - info.first_ts;
    setText(
      this.span,
      `${clockText(info.first_ts)}–${clockText(info.last_ts)} (${dur(secs)}) · ${horizonText(info.horizon)} · ops ${int(info.first_seq)}–${int(info.last_seq)} · ${int(info.keyframes.length)} keyframes · ${bytes(info.bytes_held)} in memory`,
    );
    if (!this.active) this._at(this.jumpError || `live · ${clockText(info.last_ts)} · op ${int(info.last_seq)}`);
    this._marks();
  }

  _marks() {
    const info = this.info;
    if (!info) return;
    const span = Math.max(1, info.last_seq - info.first_seq);
    const at = (seq) => `${(100 * (seq - info.first_seq)) / span}%`;
    const items = (info.keyframes || []).map((k) => h("i", { class: "kf", style: `left:${at(k.seq)}`, title: `keyframe at op ${k.seq}` }));
    for (const [key, seq] of Object.entries(this.marks)) {
      if (seq !== null && seq >= info.first_seq) items.push(h("b", { class: `mk mk-${key}`, style: `left:${at(seq)}`, title: `${key.toUpperCase()}: op ${seq}` }, key.toUpperCase()));
    }
    this.marksEl.replaceChildren(...items);
  }

  // ------------------------------------------------------------- scrub

  scrub(seq) {
    if (!this.info) return;
    this.want = seq;
    const t = seqTime(this.info, seq);
    this._at(`~${t ? clockText(t) : "—"} · op ${int(seq)} · loading…`);
    this._fetch();
  }

  async _fetch() {
    if (this.inflight || this.want === null) return;
    const seq = this.want;
    const gen = this.gen;
    this.inflight = true;
    try {
      const st = await quiet(`/api/history/state?at=${encodeURIComponent(seq)}&include_blocks=true&limit=${QUEUE_ROWS}`);
      this.fetches++;
      if (gen === this.gen) {
        if (this.want === seq) this.want = null;
        this.show(st, this.want === null); // intermediate moments too, while dragging
      }
    } catch (err) {
      if (this.want === seq) this.want = null;
      if (gen === this.gen) this._at(`op ${int(seq)}: ${err.message}`);
    } finally {
      this.inflight = false;
    }
    if (gen === this.gen && this.want !== null) this._fetch();
  }

  /** Draw a recorded moment (GET /api/history/state) on the map. */
  show(st, final = true) {
    if (!st.blocks || st.blocks.state.length !== this.model.n) {
      this._at(`op ${st.at.seq}: ${st.blocks ? "another pool size" : "no blocks"}`);
      return;
    }
    const entering = !this.active;
    this.src = new HistorySource(st);
    this.mode = "history";
    document.body.dataset.mode = "history";
    this.map.setSource(this.src);
    if (entering && this.onEnter) this.onEnter();
    if (final) this.slider.value = String(st.at.seq);
    const sm = st.summary;
    const b = sm.blocks;
    const ago = this.info ? this.info.last_ts - st.at.ts : null;
    // the clock first, the op seq beside it
    this._at(`${clockText(st.at.ts)} · op ${int(st.at.seq)}${ago !== null ? ` · latest −${dur(ago)}` : ""}`);
    $("history-text").replaceChildren(
      h("b", null, "HISTORY"),
      ` ${clockText(st.at.ts)} · op ${int(st.at.seq)} · in use ${int(b.in_use)} · cached ${int(b.cached)} · empty ${int(b.empty)} · ${int(sm.running_requests)} requests`,
      h("span", { class: "hb-note" }, " · tiles, queue and block detail follow; charts mark the moment"),
    );
    this.state = st;
    if (this.onMoment) this.onMoment(st, this.src);
    this.banner.dataset.seq = String(st.at.seq);
    setText(this.modeEl, "history");
    this.modeEl.dataset.mode = "history";
  }

  /** The moment line under the map (its full text on hover: the box has a fixed width). */
  _at(text) {
    setText(this.atEl, text);
    this.atEl.title = text;
  }

  live() {
    this.want = null;
    this.gen++;
    // an error from a jump or a fetch is about the moment left: it goes too
    this._jumpOk();
    if (!this.active) {
      this.render();
      return;
    }
    this.state = null;
    this.mode = "live";
    this.src = null;
    delete document.body.dataset.mode;
    this.map.setSource(null);
    setText(this.modeEl, "live");
    this.modeEl.dataset.mode = "live";
    if (this.onLeave) this.onLeave();
    this.render();
  }

  async jumpTo(text) {
    const problem = momentProblem(text);
    if (problem) {
      this._jumpBad(problem);
      return;
    }
    const at = parseMoment(text);
    if (at === null) return; // (null only for a text momentProblem refuses)
    this.want = null;
    const gen = ++this.gen;
    try {
      const st = await quiet(`/api/history/state?at=${encodeURIComponent(at)}&include_blocks=true&limit=${QUEUE_ROWS}`);
      this._jumpOk();
      if (gen === this.gen) this.show(st);
    } catch (err) {
      this._jumpBad(`${text.trim()}: ${err.message}`);
    }
  }

  /** The jump box refused its moment: said in the box and the moment line, until corrected. */
  _jumpBad(message) {
    this.jumpError = message;
    this.jump.classList.add("bad");
    this.jump.setAttribute("aria-invalid", "true");
    this.jump.dataset.error = message;
    this._at(message);
  }

  _jumpOk() {
    const had = Boolean(this.jumpError);
    this.jumpError = "";
    this.jump.classList.remove("bad");
    this.jump.removeAttribute("aria-invalid");
    delete this.jump.dataset.error;
    if (had && !this.active) this.render();
  }

  /** Hover line for a block of the moment shown. */
  hoverLine(id) {
    const s = this.src;
    if (!s || id < 0 || id >= s.n) return "—";
    const name = ["null", "in use", "cached", "empty"][s.state[id]];
    return `#${id} · ${name} · ref ${s.refCnt[id]}${s.hash64[id] ? ` · ${s.hash64[id]}` : ""} · at op ${int(s.seq)}`;
  }

  // -------------------------------------------------------------- diff

  mark(key) {
    if (!this.info) return;
    // (a moment shown always has its source: show() sets both, live() clears both)
    const seq = this.active && this.src ? this.src.seq : this.info.last_seq;
    this.marks[key] = seq;
    (key === "a" ? this.fromIn : this.toIn).value = String(seq);
    this._marks();
    if (this.marks.a !== null && this.marks.b !== null) this.diff();
  }

  /** What changed in the last `secs` seconds of the recording (to its latest op). */
  diffLast(secs) {
    const info = this.info;
    if (!info) return;
    const from = Math.max(info.first_ts, info.last_ts - secs);
    this.fromIn.value = String(Math.ceil(from * 1000) / 1000);
    this.toIn.value = String(info.last_seq);
    this.marks = { a: null, b: info.last_seq };
    this._marks();
    this.diff();
  }

  async diff() {
    const a = this.fromIn.value.trim();
    const b = this.toIn.value.trim();
    if (!a || !b) {
      setText(this.diffSummary, "give two moments (op seqs): mark A and B on the timeline under the map, or type them");
      return;
    }
    let from = parseMoment(a);
    let to = parseMoment(b);
    if (from === null || to === null) {
      setText(this.diffSummary, momentProblem(from === null ? a : b) || "");
      return;
    }
    if (/^\d+$/.test(from) && /^\d+$/.test(to) && Number(to) < Number(from)) [from, to] = [to, from];
    setText(this.diffSummary, "loading…");
    let d;
    try {
      d = await quiet(`/api/history/diff?from=${encodeURIComponent(from)}&to=${encodeURIComponent(to)}&limit=500`);
    } catch (err) {
      setText(this.diffSummary, `GET /api/history/diff: ${err.message}`);
      return;
    }
    this.lastDiff = d;
    this.fromIn.value = String(d.from.seq);
    this.toIn.value = String(d.to.seq);
    this.marks = { a: d.from.seq, b: d.to.seq };
    this._marks();
    const r = diffRows(d);
    const ops = d.ops || {};
    const by = Object.entries(ops.by_type || {})
      .map(([k, v]) => `${v} ${k}`)
      .join(", ");
    this.diffSummary.replaceChildren(
      h("span", null, "op ", h("b", null, int(d.from.seq)), " → ", h("b", null, int(d.to.seq)), ` (${clockText(d.from.ts)} → ${clockText(d.to.ts)}, ${dur(d.to.ts - d.from.ts)})`),
      h("span", null, h("b", null, int(ops.total)), ` ops${by ? ` (${by})` : ""}`),
      h("span", null, h("b", null, int(d.blocks_changed_total)), " blocks changed"),
    );
    setText($("diff-evicted-title"), `evicted · ${int(r.evictedTotal)}${r.evicted.length < r.evictedTotal ? ` (first ${r.evicted.length})` : ""}`);
    setText($("diff-entered-title"), `entered · ${int(r.enteredTotal)}${r.entered.length < r.enteredTotal ? ` (first ${r.entered.length})` : ""}`);
    const row = (hash, id) =>
      h("tr", { "data-hash": hash, "data-block": String(id), onclick: () => this.highlight && this.highlight([id]), title: "highlight the block on the map" }, h("td", { class: "mono" }, hash), h("td", { class: "num" }, `#${id}`));
    const none = () => h("tr", { class: "empty" }, h("td", { colspan: 2, class: "muted" }, "none"));
    this.evictedBody.replaceChildren(...(r.evicted.length ? r.evicted.map(([x, i]) => row(x, i)) : [none()]));
    this.enteredBody.replaceChildren(...(r.entered.length ? r.entered.map(([x, i]) => row(x, i)) : [none()]));
    const chips = (ids, cls) => ids.map((rid) => h("button", { class: `chip ${cls}`, "data-rid": rid, onclick: () => this.showRequest && this.showRequest(rid) }, rid));
    const rq = d.requests || {};
    this.reqsEl.replaceChildren(
      h("div", { class: "diff-rq", id: "diff-started" }, h("span", { class: "muted" }, `started ${int(r.started.length)} `), ...chips(r.started, "st")),
      h("div", { class: "diff-rq", id: "diff-ended" }, h("span", { class: "muted" }, `ended ${int(r.ended.length)} `), ...chips(r.ended, "en")),
      h("div", { class: "muted" }, `running ${int(rq.running_from)} → ${int(rq.running_to)}`),
    );
  }

  /** How big the export is now: estimated by the server from the recording's counters (GET /api/history/export/size). */
  async measureExport() {
    if (this.sizing) return;
    this.sizing = true;
    try {
      const sz = await quiet("/api/history/export/size");
      this.exportSize = { ...sz, at: performance.now() };
      setText(this.exportLink, `Export · ${bytes(sz.bytes)}`);
      this.exportLink.dataset.bytes = String(sz.bytes);
      this.exportLink.title = `the recording as NDJSON: about ${bytes(sz.bytes)} (estimated from the recording), ${int(sz.lines)} lines at op ${int(sz.last_seq)}; it grows as the pool works; sent gzip-compressed to a browser; replay it with \`blockpool replay FILE\``;
    } catch (err) {
      this.exportLink.title = `the recording as NDJSON (its size: ${err.message})`;
    } finally {
      this.sizing = false;
    }
  }

  async exportWithToken(path, ext) {
    try {
      const resp = await fetch(path, { headers: { Authorization: `Bearer ${getToken()}` } });
      if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
      const blob = await resp.blob();
      const url = URL.createObjectURL(blob);
      const a = h("a", { href: url, download: `blockpool-recording-${Math.floor(Date.now() / 1000)}.${ext}` });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (err) {
      setText(this.span, `export: ${err.message}`);
    }
  }
}
