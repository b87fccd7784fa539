// @ts-check
// A trace replay driving the pool (serve --trace, POST /api/trace/start): its
// progress and the trace's own prefix hit rate, as one item in the top bar.
// Hidden while no trace is loaded.

import { api } from "../../common/api.js";
import { $, h, setText } from "../../common/dom.js";
import { pct } from "../../common/format.js";
import { explain } from "../../common/terms.js";

export class TraceItem {
  constructor() {
    this.value = h("b", { id: "h-trace" }, "—");
    this.item = h("span", { class: "hitem", "data-h": "trace", hidden: true, title: explain("trace") }, h("i", null, "trace"), this.value);
    $("health").append(this.item);
    this.status = null;
    this.busy = false;
  }

  /** Ask the server (quietly: a server without the route just shows nothing). */
  async refresh() {
    if (this.busy) return;
    this.busy = true;
    try {
      this.status = await api("GET", "/api/trace", undefined, { quiet: true });
    } catch {
      this.status = null;
    } finally {
      this.busy = false;
    }
    this.render();
  }

  render() {
    const st = this.status;
    this.item.hidden = !(st && st.loaded);
    if (this.item.hidden) return;
    const s = st.stats;
    const state = st.running ? "" : " (stopped)";
    setText(this.value, `${st.name} · ${pct(st.progress, 0)} · hit ${pct(s.hit_rate)}${state}`);
    this.item.dataset.value = String(s.hit_rate);
    this.item.title =
      `${explain("trace")}\n\n${s.arrived} of ${st.requests} requests arrived (x${st.speed}` +
      `${st.loop ? ", looping" : ""}); ${s.admitted} admitted, ${s.finished} finished, ` +
      `${s.refused} refused, ${s.preemptions} preemptions, ${st.requests_waiting} waiting; ` +
      `prompt tokens hit ${s.hit_tokens} of ${s.prompt_tokens}`;
  }
}
