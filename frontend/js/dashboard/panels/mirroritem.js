// @ts-check
// The mirror in the top bar, on a service that follows a real vLLM engine
// (blockpool serve --mirror): the engine, whether the pool shown is exactly
// the engine's, the lag, resyncs and divergences, and the lag from the
// engine's step to this page (the stream frames' `mirror` header, see
// wire/mirrorlag.js).  Absent on any other service.
//
// When the engine stops telling (silent, refused, the mirror behind it, a
// restart into another pool) the whole page is stale, not only this item:
// body[data-engine="stale"] dims the tiles, the panels and the charts, a
// banner under the top bar says since when the figures are old, and the
// page's "live" marks say "stale" (health.js reads it).

import { api, getToken } from "../../common/api.js";
import { $, h, setText } from "../../common/dom.js";
import { clockText, int } from "../../common/format.js";

/** A lag in ms as the item shows it ("—" before a sample). */
const msText = (/** @type {number | null} */ ms) => (ms === null ? "—" : `${Math.round(ms)}ms`);

const POLL_MS = 1000;

/** The mirror's states in which the engine is not telling the page anything new. */
const STALE_STATES = new Set(["stale", "refused", "behind", "rebuilding", "restart_needed"]);

/**
 * How far the engine's digest is behind, in words (GET /api/mirror's
 * plugin_digest; null or absent: the plugin does not say).  The plugin reads
 * vLLM's pool only while the engine waits for a forward pass: an engine that
 * never waits (its passes ~0 ms) gets no digest, and this says why; readings
 * thrown away (the engine moved during them; of those, the ones still
 * running when the engine came back), stopped in time (what they read kept),
 * and forward passes planned by their tokens found too long, where the plugin
 * says them.
 * @param {{behind_blocks: number, sweep_rows_left: number | null, forward_pass_ms: number | null, digests_taken: number, readings_discarded?: number | null, readings_stopped?: number | null, readings_overrun?: number | null, plans_too_long?: number | null} | null | undefined} d
 */
function digestText(d) {
  if (!d) return "engine's digest progress: not said by the plugin";
  const pass = d.forward_pass_ms === null ? "not known yet" : `${d.forward_pass_ms.toFixed(2)}ms`;
  const where = d.sweep_rows_left === null
    ? `${int(d.behind_blocks)} blocks behind`
    : `rebuilding, ${int(d.sweep_rows_left)} rows left`;
  /** ", N words" where the plugin says N, nothing where it does not. */
  const said = (/** @type {number | null | undefined} */ n, /** @type {string} */ words) =>
    (n == null ? "" : `, ${int(n)} ${words}`);
  const thrown = said(d.readings_discarded, "readings thrown away (the engine moved during them)");
  const overrun = said(d.readings_overrun, "of them still running when the engine came back");
  const stopped = said(d.readings_stopped, "stopped in time (kept)");
  const tooLong = said(d.plans_too_long, "passes planned by their tokens found too long");
  return `engine's digest: ${where}, ${int(d.digests_taken)} taken${thrown}${overrun}${stopped} · the engine's shortest forward pass ${pass} (the plugin reads its pool only while the engine waits for one)${tooLong}`;
}

/**
 * The page is stale (the engine says nothing new) or not: the banner and body[data-engine].
 * @param {string | null} why the banner's words (null: the engine is followed)
 */
export function markEngine(why) {
  const banner = document.getElementById("engine-banner");
  document.body.dataset.engine = why ? "stale" : "live";
  if (!banner) return;
  banner.hidden = !why;
  if (why && banner.textContent !== why) banner.textContent = why;
}

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
    document.body.dataset.mirror = "1"; // the panels say "not known on a mirror" from now on
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
      markEngine(`The mirror's state is unreachable (${err.message || err}): the figures below may be old.`);
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
    // the engine's step to the mirror's pool (the page's own lag is "page", beside it)
    if (st.lag_ms !== null && st.connected) text += ` · applied ${int(st.lag_ms)}ms`;
    this.markPage(st, text);
    // resyncs: after the first sync (a server with `syncs` counts them so;
    // an older one counted joining the engine as a resync too)
    const resyncs = "syncs" in st ? st.resyncs : Math.max(0, st.resyncs - 1);
    const title = [
      `following ${st.endpoint} (engine ${eng.engine_id || "?"})`,
      `operations applied ${int(st.ops_applied)} · digests checked ${int(st.digests_checked)}`,
      // how old the proof of "exact" is (an older server says nothing of it)
      ...("seconds_since_digest" in st
        ? [st.seconds_since_digest === null
          ? "last matching digest: none since the sync"
          : `last matching digest ${st.seconds_since_digest.toFixed(1)}s ago, ${int(st.ops_since_digest)} operations since`]
        : []),
      `divergences ${int(st.divergences)} · gaps ${int(st.gaps)} · resyncs ${int(resyncs)} (after the first sync) · engine drops ${int(st.engine_drops)}`,
      `applied: the engine's step to the mirror's pool, ${st.lag_ms === null ? "not known yet" : `${int(st.lag_ms)}ms for the latest batch`} · p50 ${st.lag_p50_ms === null ? "—" : `${st.lag_p50_ms.toFixed(1)}ms`} · p99 ${st.lag_p99_ms === null ? "—" : `${st.lag_p99_ms.toFixed(1)}ms`}`,
      "page: the engine's step to this page (hover it) · the top bar's frame lag: the server's tick to this page · analysis lag: operations the analysis has not yet read",
      ...(st.state === "behind" ? [`behind: ${int(st.backlog)} messages waiting, the oldest ${int(st.backlog_ms)}ms`] : []),
      st.plugin_step_us
        ? `plugin per batch (one in 7 timed; a step sends two) p50 ${st.plugin_step_us.p50.toFixed(0)}µs · p99 ${st.plugin_step_us.p99.toFixed(0)}µs · max ${st.plugin_step_us.max.toFixed(0)}µs`
        : "plugin per batch: not known yet",
      digestText(st.plugin_digest),
      `stream ${st.authenticated ? "signed and verified" : "not authenticated (no shared secret)"}`,
      ...(eng.problems && eng.problems.length ? ["not followed exactly:", ...eng.problems] : []),
      ...(st.last_problem ? [`last problem: ${st.last_problem}`] : []),
    ].join("\n");
    this.show(level, text, title);
  }

  /**
   * The whole page stale while the engine tells nothing new (see the module doc).
   * @param {{state: string, seconds_since_message?: number | null, backlog?: number, backlog_ms?: number | null}} st GET /api/mirror
   * @param {string} text the item's words
   */
  markPage(st, text) {
    if (!STALE_STATES.has(st.state)) {
      markEngine(null);
      return;
    }
    const ago = st.seconds_since_message;
    const since = ago === null || ago === undefined ? "" : ` as of ${clockText(Date.now() / 1000 - ago)} (${int(ago)} s ago)`;
    /** @type {Record<string, string>} */
    const what = {
      stale: `The engine has said nothing for ${ago === null || ago === undefined ? "a while" : `${int(ago)} s`}`,
      refused: "The engine's messages are refused (not signed with the mirror's secret)",
      behind: `The mirror is behind the engine (${int(st.backlog ?? 0)} messages wait)`,
      rebuilding: "The engine restarted as another pool: the mirror is rebuilding",
      restart_needed: "The engine restarted as another pool: restart the mirror",
    };
    markEngine(`STALE · ${what[st.state]}: every figure on this page is the engine's${since}, not live · ${text}`);
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
