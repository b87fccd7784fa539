// @ts-check
// The live event log: the newest events first, from the stream's ticks.

import { $, clear, h, shortHash } from "./dom.js";

const KEEP = 300;

export class EventLog {
  constructor() {
    /** @type {import("./api.js").FleetEvent[]} the newest last */
    this.items = [];
    this.paused = false;
    /** @type {string | null} the instance of "selected only" */
    this.selected = null;
    $("ev-pause").addEventListener("click", () => {
      this.paused = !this.paused;
      $("ev-pause").textContent = this.paused ? "resume" : "pause";
      if (!this.paused) this.render();
    });
    $("ev-selected").addEventListener("change", () => this.render());
  }

  /** @param {string} name */
  select(name) {
    this.selected = name;
    this.render();
  }

  /** @param {import("./api.js").FleetEvent[]} events */
  add(events) {
    if (!events.length) return;
    for (const e of events) this.items.push(e);
    if (this.items.length > KEEP * 4) this.items.splice(0, this.items.length - KEEP * 4);
    if (!this.paused) this.render();
  }

  render() {
    const box = $("events");
    const onlySelected = $("ev-selected", HTMLInputElement).checked;
    const shown = [];
    for (let i = this.items.length - 1; i >= 0 && shown.length < KEEP; i--) {
      const e = this.items[i];
      if (onlySelected && e.instance !== this.selected) continue;
      shown.push(e);
    }
    clear(box);
    for (const e of shown) {
      const hashes = (e.block_hashes || []).map(shortHash).join(" ");
      const detail =
        e.type === "BlockStored"
          ? `${hashes}${e.parent_block_hash ? ` ← ${shortHash(e.parent_block_hash)}` : ""} · ${e.num_tokens} tok${e.lora_name ? ` · ${e.lora_name}` : ""}${e.medium ? ` · ${e.medium}` : ""}`
          : e.type === "BlockRemoved"
            ? `${hashes}${e.medium ? ` · ${e.medium}` : ""}`
            : "";
      box.append(
        h(
          "div",
          { class: `ev t-${e.type}`, title: `batch seq ${e.batch_seq} · ${new Date(e.ts * 1000).toISOString()}` },
          `${e.instance} #${e.batch_seq} ${e.type} ${detail}${e.group_idx !== undefined ? ` · g${e.group_idx}` : ""}`,
        ),
      );
    }
    if (!shown.length) box.append(h("div", { class: "muted" }, "waiting for events…"));
  }
}
