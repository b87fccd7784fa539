// @ts-check
// The mirror in the top bar, on a service that follows a real vLLM engine
// (blockpool serve --mirror): the engine, whether the pool shown is exactly
// the engine's, the lag, resyncs and divergences, and the lag from the
// engine's step to this page (the stream frames' `mirror` header, see
// wire/mirrorlag.js).  Absent on any other service.

import { api, getToken } from "../../common/api.js";
import { $, h, setText } from "../../common/dom.js";
import { int } from "../../common/format.js";

/** A lag in ms as the item shows it ("—" before a sample). */
const msText = (/** @type {number | null} */ ms) => (ms === null ? "—" : `${Math.round(ms)}ms`);

const POLL_MS = 1000;

export class MirrorItem {
  /**
   * `onMirror()`: called once, when the service turns out to be a mirror;
   * `pageLag`: the stream's samples of the engine-to-page lag.
   * @param {() => void} onMirror
   * @param {import("../wire/mirrorlag.js").MirrorLag} pageLag
   */
  constructor(onMirror, pageLag) {
    this.onMirror = onMirror;
    this.pageLag = pageLag;
    this.value = h("b", { id: "h-mirror" }, "—");
    this.page = h("small", { id: "h-mirror-page", class: "muted", hidden: "" });
    this.item = h("span", { class: "hitem", "data-h": "mirror", hidden: "" }, h("i", null, "mirror"), this.value, this.page);
    $("health").append(this.item);
    /** @type {number | undefined} the poll, once started */
    this.timer = undefined;
    this.start();
  }

  /** A mirror marks its answers (x-blockpool-mirror): only then is there anything to poll. */
  async start() {
    /** @type {Record<string, string>} */
    const headers = { Accept: "application/json" };
    const token = getToken();
    if (token) headers.Authorization = `Bearer ${token}`;
    let mirror = false;
    try {
      const resp = await fetch("/api/config", { headers });
      mirror = resp.headers.get("x-blockpool-mirror") === "1";
    } catch {
      mirror = false;
    }
    if (!mirror) {
      this.item.remove(); // not a mirror: nothing to show, ever
      return;
    }
    if (this.onMirror) this.onMirror();
    this.timer = setInterval(() => this.poll(), POLL_MS);
    this.poll();
  }

  async poll() {
    this.showPageLag();
    let st;
    try {
      st = await api("GET", "/api/mirror", undefined, { quiet: true });
    } catch (err) {
      if (err.status === 404) {
        clearInterval(this.timer); // not a mirror: nothing to show, ever
        this.item.remove();
        return;
      }
      this.show("err", "unreachable", String(err.message || err));
      return;
    }
    document.body.dataset.mirror = "1";
    const eng = st.engine || {};
    const name = eng.vllm_version ? `vLLM ${eng.vllm_version}` : "engine";
    let level = "ok";
    let text = `${name} · exact`;
    switch (st.state) {
      case "exact":
        break;
      case "stale":
        level = "err";
        text = `${name} · stale ${st.seconds_since_message === null ? "" : `${int(st.seconds_since_message)}s`}`;
        break;
      case "refused":
        level = "err";
        text = `${name} · refused (not signed with the mirror's secret)`;
        break;
      case "rebuilding":
        level = "warn";
        text = `${name} · restarted as another pool: rebuilding`;
        break;
      case "restart_needed":
        level = "err";
        text = `${name} · restarted as another pool: restart the mirror`;
        break;
      case "behind":
        level = "warn";
        text = `${name} · behind ${int(st.backlog)} msgs`;
        break;
      case "syncing":
        level = "warn";
        text = `${name} · resyncing`;
        break;
      case "synced":
        level = "warn";
        text = `${name} · verifying`; // restored: no digest compared yet
        break;
      default:
        level = "warn";
        text = `${name} · not exact`;
    }
    if (st.lag_ms !== null && st.connected) text += ` · ${int(st.lag_ms)}ms`;
    const title = [
      `following ${st.endpoint} (engine ${eng.engine_id || "?"})`,
      `operations applied ${int(st.ops_applied)} · digests checked ${int(st.digests_checked)}`,
      `divergences ${int(st.divergences)} · gaps ${int(st.gaps)} · resyncs ${int(st.resyncs)} · engine drops ${int(st.engine_drops)}`,
      `lag p50 ${st.lag_p50_ms === null ? "—" : `${st.lag_p50_ms.toFixed(1)}ms`} · p99 ${st.lag_p99_ms === null ? "—" : `${st.lag_p99_ms.toFixed(1)}ms`}`,
      ...(st.state === "behind" ? [`behind: ${int(st.backlog)} messages waiting, the oldest ${int(st.backlog_ms)}ms`] : []),
      st.plugin_step_us
        ? `plugin per engine step p50 ${st.plugin_step_us.p50.toFixed(0)}µs · p99 ${st.plugin_step_us.p99.toFixed(0)}µs · max ${st.plugin_step_us.max.toFixed(0)}µs`
        : "plugin per engine step: not known yet",
      `stream ${st.authenticated ? "signed and verified" : "not authenticated (no shared secret)"}`,
      ...(eng.problems && eng.problems.length ? ["not followed exactly:", ...eng.problems] : []),
      ...(st.last_problem ? [`last problem: ${st.last_problem}`] : []),
    ].join("\n");
    this.show(level, text, title);
  }

  /** The engine-to-page lag beside the item's text: the latest, and the p50 on hover. */
  showPageLag() {
    const lag = this.pageLag;
    if (!lag.samples.length) return; // no batch has reached this page yet
    const p50 = lag.p50();
    this.page.hidden = false;
    setText(this.page, ` · page ${msText(lag.lastMs)}`);
    this.page.dataset.lastMs = String(lag.lastMs);
    this.page.dataset.p50Ms = String(p50);
    this.page.dataset.samples = String(lag.samples.length);
    this.page.title = [
      `engine step to this page: ${msText(lag.lastMs)} for the latest batch, p50 ${msText(p50)} over the last ${lag.samples.length}`,
      "(the receive time of the first frame bringing a batch, minus the engine's step time for it: mirror.engine_ts)",
      "assumes the engine's machine and this browser keep one clock: a skew between them adds to the figure or takes from it",
    ].join("\n");
  }

  /**
   * @param {string} level ok | warn | err
   * @param {string} text
   * @param {string} title
   */
  show(level, text, title) {
    this.item.hidden = false;
    this.item.dataset.level = level;
    setText(this.value, text);
    this.item.title = title;
  }
}
