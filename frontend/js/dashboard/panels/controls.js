// @ts-check
// Controls: the demo workload (start / stop / tune), admitting and finishing
// requests by hand, resetting the prefix cache, and the bearer token.  The
// reset dialog says beforehand when the pool will refuse (blocks held) and
// offers "stop the workload and reset"; its outcome shows in the dialog.

import { ApiError, get, getToken, post, setToken } from "../../common/api.js";
import { $, h, setText } from "../../common/dom.js";
import { int } from "../../common/format.js";

/**
 * The demo workload's state (GET /api/demo): the fields shown.
 * @typedef {object} DemoStatus
 * @property {boolean} running
 * @property {number} rate arrivals per second
 * @property {number} max_running
 * @property {number} [max_waiting]
 * @property {number} requests_running
 * @property {number} requests_waiting
 * @property {[number, number]} decode_tokens
 * @property {Record<string, number>} mix
 * @property {{admitted: number, finished: number, dropped_waiting?: number}} stats
 */

/**
 * The trace replay's state (serve --trace).
 * @typedef {{loaded: boolean, running: boolean, name?: string, progress?: number, requests_running: number, requests_waiting: number}} TraceStatus
 */

/** @typedef {"ok" | "err" | "muted" | "refused"} ResultKind */

/**
 * "1 2 3", "1,2,3", "0..255", "rand 512" (mixable: "0..63 rand 32").
 * @param {string} text
 */
export function parseTokens(text) {
  /** @type {number[]} */
  const out = [];
  const parts = text.trim().split(/[\s,]+/).filter(Boolean);
  for (let i = 0; i < parts.length; i++) {
    const p = parts[i];
    let m;
    if ((m = /^(\d+)\.\.(\d+)$/.exec(p))) {
      const a = Number(m[1]);
      const b = Number(m[2]);
      if (b < a || b - a > 262144) throw new Error(`bad range ${p}`);
      for (let t = a; t <= b; t++) out.push(t);
    } else if (p === "rand" && /^\d+$/.test(parts[i + 1] || "")) {
      const n = Number(parts[++i]);
      for (let k = 0; k < n; k++) out.push(Math.floor(Math.random() * 32000));
    } else if (/^\d+$/.test(p)) {
      out.push(Number(p));
    } else {
      throw new Error(`not a token id: ${p}`);
    }
  }
  return out;
}

export class Controls {
  /**
   * @param {import("../state/model.js").PoolModel} model
   * @param {import("./detail.js").DetailPanel} detail
   * @param {() => void} onToken the token changed (reconnect with it)
   */
  constructor(model, detail, onToken) {
    this.model = model;
    this.detail = detail;
    this.onToken = onToken;
    this.demoStatus = $("demo-status");
    this.reqBody = $("req-body");
    this.result = $("ctl-result");
    this.dialog = $("reset-dialog", HTMLDialogElement);
    /** @type {((rid: string) => void) | null} the page's request story (set by main.js) */
    this.onStory = null;
    this.authRequired = false;
    this.readOnly = false; // a mirror (setReadOnly)
    this.wire();
  }

  /**
   * @param {ResultKind} kind
   * @param {string | (string | Node)[]} text
   */
  show(kind, text) {
    this.result.className = `result ${kind}`;
    this.result.replaceChildren(...(Array.isArray(text) ? text : [text]));
  }

  /**
   * @param {string} what the action that failed
   * @param {Error & {code?: string}} err
   */
  showError(what, err) {
    if (err instanceof ApiError && err.status === 401) {
      this.show("err", `${what}: ${err.message} — enter the server's token at the top right.`);
      $("token").classList.add("need");
      $("token").focus();
      return;
    }
    this.show("err", `${what}: ${err.message}${err.code ? ` (${err.code})` : ""}`);
  }

  wire() {
    const tok = $("token", HTMLInputElement);
    tok.value = getToken();
    tok.addEventListener("change", () => {
      setToken(tok.value.trim());
      tok.classList.remove("need");
      this.onToken();
    });
    $("demo-start").addEventListener("click", () => this.demo("start"));
    $("trace-start").addEventListener("click", () => this.trace("start"));
    $("trace-stop").addEventListener("click", () => this.trace("stop"));
    $("demo-stop").addEventListener("click", () => this.demo("stop"));
    for (const el of $("demo-form").querySelectorAll("input")) {
      el.addEventListener("input", () => (el.dataset.touched = "1"));
    }
    $("demo-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      this.tune();
    });
    $("admit-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      this.admit();
    });
    $("reset-btn").addEventListener("click", () => this.openReset());
    $("reset-confirm").addEventListener("click", () => this.reset());
    $("reset-stop").addEventListener("click", () => this.stopAndReset());
  }

  /** The dialog, with what a reset would do now (or why it would be refused). */
  openReset() {
    const hd = this.model.header;
    const held = (hd.blocks && hd.blocks.in_use) || 0;
    const drop = `${int(hd.hash_map_keys)} cached hashes will be dropped (every cached block becomes empty).`;
    setText(
      $("reset-facts"),
      held
        ? `${drop} But ${int(held)} block(s) are in use by ${int(hd.running_requests)} running request(s): while any block is held the pool refuses a reset (as vLLM does). Stop the workload and finish the requests first, or let this page do it.`
        : drop,
    );
    $("reset-stop").hidden = !held;
    $("reset-confirm").textContent = held ? "Reset anyway (will be refused)" : "Reset";
    $("reset-close").textContent = "Cancel";
    this.outcome(null);
    this.dialog.showModal();
  }

  /**
   * The outcome in the dialog (and in the controls' result line).
   * @param {ResultKind | null} kind null: none (the dialog just opened)
   * @param {(string | Node)[]} [parts]
   */
  outcome(kind, parts = []) {
    const box = $("reset-outcome");
    if (!kind) {
      box.hidden = true;
      box.replaceChildren();
      return;
    }
    box.hidden = false;
    box.className = `result ${kind}`;
    box.replaceChildren(...parts);
    this.show(kind, parts.map((p) => (p instanceof Node ? p.cloneNode(true) : p)));
    $("reset-close").textContent = "Close";
  }

  /** Stop the demo (it finishes its requests), finish the others, then reset. */
  async stopAndReset() {
    this.outcome("muted", ["stopping the demo workload…"]);
    try {
      await post("/api/demo/stop");
      const running = await get("/api/requests?limit=10000");
      const ids = (running.items || []).map((/** @type {{request_id: string}} */ r) => r.request_id);
      this.outcome("muted", [`finishing ${int(ids.length)} running request(s)…`]);
      for (const rid of ids) {
        try {
          await post(`/api/requests/${encodeURIComponent(rid)}/finish`);
        } catch (err) {
          if (!(err instanceof ApiError && err.status === 404)) throw err; // 404: it just finished
        }
      }
      this.refreshDemo();
      this.refreshRequests();
    } catch (err) {
      this.outcome("err", [`stop the workload: ${err.message}${err.code ? ` (${err.code})` : ""}`]);
      return;
    }
    await this.reset();
  }

  /** @param {"start" | "stop"} action */
  async demo(action) {
    try {
      const st = await post(`/api/demo/${action}`);
      this.renderDemo(st);
      this.show("ok", `demo ${action === "start" ? "started" : "stopped"}`);
    } catch (err) {
      this.showError(`demo ${action}`, err);
    }
  }

  async tune() {
    const num = (/** @type {string} */ id) => {
      const v = $(id, HTMLInputElement).value.trim();
      return v === "" ? undefined : Number(v);
    };
    /** @type {{rate?: number, max_running?: number, decode_tokens?: [number, number], mix?: Record<string, number>}} */
    const body = {};
    if (num("demo-rate") !== undefined) body.rate = num("demo-rate");
    if (num("demo-maxrun") !== undefined) body.max_running = num("demo-maxrun");
    const lo = num("demo-dmin");
    const hi = num("demo-dmax");
    if (lo !== undefined && hi !== undefined) body.decode_tokens = [lo, hi];
    /** @type {Record<string, number>} */
    const mix = {};
    for (const k of ["chat", "conversation", "document", "noise"]) {
      const v = num(`mix-${k}`);
      if (v !== undefined) mix[k] = v;
    }
    if (Object.keys(mix).length) body.mix = mix;
    try {
      const st = await post("/api/demo/config", body);
      for (const el of $("demo-form").querySelectorAll("input")) delete el.dataset.touched;
      this.renderDemo(st, true);
      this.show("ok", "demo settings applied");
    } catch (err) {
      this.showError("demo config", err);
    }
  }

  async admit() {
    let tokens;
    try {
      tokens = parseTokens($("admit-tokens", HTMLInputElement).value);
      if (!tokens.length) throw new Error("give some token ids");
    } catch (err) {
      this.show("err", `admit: ${err.message}`);
      return;
    }
    /** @type {{token_ids: number[], lora_name?: string, cache_salt?: string}} */
    const body = { token_ids: tokens };
    const lora = $("admit-lora", HTMLInputElement).value.trim();
    const salt = $("admit-salt", HTMLInputElement).value.trim();
    if (lora) body.lora_name = lora;
    if (salt) body.cache_salt = salt;
    try {
      const r = await post("/api/requests", body);
      const blocks = r.block_ids.flat().length;
      this.show("ok", [
        "admitted ",
        h("b", { id: "admit-rid" }, r.request_id),
        `: ${r.num_tokens} tokens, ${blocks} blocks, ${r.num_hit_blocks} prefix hits, ${r.num_new_blocks} new`,
      ]);
      this.detail.showRequest(r.request_id);
      this.refreshRequests();
    } catch (err) {
      this.showError("admit", err);
    }
  }

  /** @param {string} rid */
  async finish(rid) {
    try {
      await post(`/api/requests/${encodeURIComponent(rid)}/finish`);
      this.show("ok", `finished ${rid}`);
      if (this.detail.request && this.detail.request.id === rid) this.detail.clearHighlights();
      this.refreshRequests();
    } catch (err) {
      this.showError(`finish ${rid}`, err);
    }
  }

  async reset() {
    const keys = this.model.header.hash_map_keys;
    try {
      await post("/api/pool/reset");
      this.outcome("ok", [h("b", null, "Reset done"), `: the prefix cache is empty (${int(keys)} cached hashes dropped).`]);
      $("reset-stop").hidden = true;
      $("reset-confirm").textContent = "Reset";
    } catch (err) {
      if (err instanceof ApiError && err.code === "reset_refused") {
        const d = err.details || {};
        const num = (/** @type {unknown} */ v) => (typeof v === "number" ? v : null);
        this.outcome("refused", [
          h("b", null, "Reset refused"),
          ": ",
          h("span", { class: "reset-held" }, int(num(d.held_blocks))),
          ` block(s) are still held${d.running_requests !== undefined ? ` by ${int(num(d.running_requests))} running request(s)` : ""}. Stop the workload and finish them first.`,
        ]);
        $("reset-stop").hidden = false;
      } else if (err instanceof ApiError && err.status === 401) {
        this.outcome("err", [`reset: ${err.message}: enter the server's token at the top right.`]);
        $("token").classList.add("need");
      } else {
        this.outcome("err", [`reset: ${err.message}${err.code ? ` (${err.code})` : ""}`]);
      }
    }
  }

  /**
   * @param {DemoStatus} st
   * @param {boolean} [force] write the inputs even where the user is editing
   */
  renderDemo(st, force = false) {
    setText(
      this.demoStatus,
      `${st.running ? "running" : "stopped"} · ${st.rate}/s · ${st.requests_running} running · ${st.requests_waiting} waiting · ${int(st.stats.admitted)} admitted · ${int(st.stats.finished)} finished`,
    );
    // arrivals dropped because too many waited: said, never silent
    const dropped = st.stats.dropped_waiting || 0;
    if (dropped) {
      this.demoStatus.append(
        " · ",
        h("b", { class: "demo-dropped", id: "demo-dropped", title: `arrivals dropped because ${st.max_waiting ?? "too many"} were already waiting (the workload outran the pool): /metrics blockpool_demo_dropped_waiting_total` }, `${int(dropped)} dropped`),
      );
    }
    this.demoStatus.classList.toggle("dropping", dropped > 0);
    this.demoStatus.classList.toggle("on", st.running);
    $("demo-start", HTMLButtonElement).disabled = st.running;
    $("demo-stop", HTMLButtonElement).disabled = !st.running;
    const fill = (/** @type {string} */ id, /** @type {number} */ v) => {
      const el = $(id, HTMLInputElement);
      if (force || (document.activeElement !== el && el.dataset.touched !== "1")) el.value = String(v);
    };
    fill("demo-rate", st.rate);
    fill("demo-maxrun", st.max_running);
    fill("demo-dmin", st.decode_tokens[0]);
    fill("demo-dmax", st.decode_tokens[1]);
    for (const [k, v] of Object.entries(st.mix)) fill(`mix-${k}`, v);
  }

  /**
   * The trace replay's controls (serve --trace): shown while a trace is loaded.
   * @param {TraceStatus | null | undefined} st
   */
  renderTrace(st) {
    const box = $("trace-ctl");
    if (!st || !st.loaded) {
      box.hidden = true;
      return;
    }
    box.hidden = false;
    setText(
      $("trace-status"),
      `${st.running ? "running" : "stopped"} · ${st.name || "trace"} · ${Math.round((st.progress || 0) * 100)}% · ${int(st.requests_running)} running · ${int(st.requests_waiting)} waiting`,
    );
    $("trace-status").classList.toggle("on", st.running);
    $("trace-start", HTMLButtonElement).disabled = st.running;
    $("trace-stop", HTMLButtonElement).disabled = !st.running;
  }

  /** @param {"start" | "stop"} action */
  async trace(action) {
    try {
      const st = await post(`/api/trace/${action}`);
      this.renderTrace(st);
      this.show("ok", `trace replay ${action === "start" ? "started" : "stopped"}`);
    } catch (err) {
      this.showError(`trace ${action}`, err);
    }
  }

  async refreshDemo() {
    try {
      this.renderDemo(await get("/api/demo"));
    } catch {
      /* shown elsewhere */
    }
  }

  async refreshRequests() {
    try {
      const data = await get("/api/requests?limit=40");
      setText($("req-count"), `${int(data.total)} running`);
      const rows = data.items.map((/** @type {{request_id: string, num_tokens: number, num_blocks: number, num_hit_blocks: number}} */ r) =>
        h(
          "tr",
          null,
          h(
            "td",
            { class: "mono" },
            h("a", { href: "#", onclick: (/** @type {MouseEvent} */ ev) => (ev.preventDefault(), this.detail.showRequest(r.request_id)) }, r.request_id),
            " ",
            h("button", { class: "small link", "data-story": r.request_id, title: "its story: blocks, hits, misses, times", onclick: () => this.onStory && this.onStory(r.request_id) }, "story"),
          ),
          h("td", { class: "num" }, int(r.num_tokens)),
          h("td", { class: "num" }, int(r.num_blocks)),
          h("td", { class: "num" }, int(r.num_hit_blocks)),
          h("td", null, h("button", { class: "small", "data-finish": r.request_id, onclick: () => this.finish(r.request_id) }, "finish")),
        ),
      );
      this.reqBody.replaceChildren(...rows);
    } catch {
      /* shown elsewhere */
    }
  }

  /** @param {boolean} required the server needs a token for writes */
  setAuth(required) {
    this.authRequired = required;
    const tok = $("token", HTMLInputElement);
    // short enough for the compact top bar; the whole sentence on hover
    tok.placeholder = required ? "token for writes" : "token (not needed)";
    tok.title = required ? "this server needs its bearer token for every change" : "this server takes changes without a token";
    tok.classList.toggle("need", required && !getToken());
    if (this.readOnly) setText($("auth-note"), "read-only mirror");
    else setText($("auth-note"), required ? (getToken() ? "writes: token set" : "writes need a token") : "writes: open");
  }

  /** A mirror of a vLLM engine: no writes at all; the controls that would change the pool go. */
  setReadOnly() {
    this.readOnly = true;
    setText($("auth-note"), "read-only mirror");
    for (const id of ["demo-start", "trace-start", "admit-form", "reset-btn"]) {
      const group = /** @type {HTMLElement | null} */ ($(id).closest(".ctl-group"));
      if (group) group.style.display = "none"; // inline: renderTrace's `hidden` cannot show it again
    }
    for (const id of ["demo-start", "demo-stop", "trace-start", "trace-stop", "admit-btn", "reset-btn", "reset-confirm", "reset-stop"]) $(id, HTMLButtonElement).disabled = true;
    this.show("muted", "read-only mirror: this pool follows a vLLM engine's; demo, trace, admit and reset are off");
  }
}
