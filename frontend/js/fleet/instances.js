// @ts-check
// The instance selector: one card per observed stream, with its health.

import { age, clear, el, num } from "./dom.js";

export function renderInstances(container, instances, selected, onSelect) {
  clear(container);
  for (const inst of instances) {
    // a stale pool's map is the last one heard: "exact" would claim too much
    const exact = inst.stale
      ? el("span", { class: "badge stale", title: inst.stale_hint || "" }, "stale")
      : inst.exact
        ? el("span", { class: "badge exact", title: "every batch since seq 0 (or a clear) applied" }, "exact")
        : el("span", { class: "badge inexact", title: inst.inexact_reason || "" }, "inexact");
    const stat = (label, value, title) => el("span", { title: title || "" }, el("i", {}, `${label} `), value);
    const card = el(
      "div",
      {
        class: "instance",
        role: "option",
        "data-name": inst.name,
        "aria-selected": inst.name === selected ? "true" : "false",
        tabindex: "0",
        onclick: () => onSelect(inst.name),
        onkeydown: (ev) => {
          if (ev.key === "Enter" || ev.key === " ") onSelect(inst.name);
        },
      },
      el(
        "div",
        { class: "top" },
        el("span", { class: inst.connected ? "dot on" : "dot", title: inst.connected ? "connected" : "disconnected" }),
        el("span", { class: "name" }, inst.name),
        el("span", { class: "spacer" }),
        inst.dashboard_url
          ? el("a", { class: "dashboard-link", href: inst.dashboard_url, target: "_blank", rel: "noopener", title: "this engine's own dashboard (blockpool serve --mirror): block map, LRU queue, miss reasons, …", onclick: (ev) => ev.stopPropagation() }, "dashboard ↗")
          : null,
        exact,
      ),
      el(
        "div",
        { class: "endpoint" },
        inst.mode === "bind" ? `bound ${inst.endpoint}` : inst.endpoint,
        inst.replay_endpoint ? ` · replay ${inst.replay_endpoint}` : " · no replay",
        inst.ranks_seen && inst.ranks_seen.length ? ` · dp ${inst.ranks_seen.join(",")}` : "",
      ),
      el(
        "div",
        { class: "stats" },
        stat("keys", num(inst.keys), "hashes held"),
        stat("blocks", num(inst.blocks), "copies of held hashes"),
        stat("seq", inst.last_seq === null ? "—" : num(inst.last_seq), "last publisher seq applied"),
        stat("batches", num(inst.batches)),
        stat("events", num(inst.events)),
        stat("gaps", num(inst.gaps), "sequence gaps detected"),
        stat("replays", num(inst.replays), "replay requests"),
        stat("failed", num(inst.replay_failures), "replays that failed or fell short"),
        stat("missed", num(inst.missed), "batches lost for good"),
        stat("restarts", num(inst.restarts), "publisher restarts (seq went back)"),
        stat("dups", num(inst.duplicates), "batches seen twice (replay and live)"),
        stat("last", age(inst.last_batch_age_s), "last batch applied"),
      ),
      groupsLine(inst),
      inst.stale ? el("div", { class: "reason stale" }, inst.stale_hint || "stale") : null,
      !inst.stale && inst.idle
        ? el("div", { class: "note idle", title: "connected; nothing changed, the map stands" },
            `idle: connected, last message ${age(inst.silent_s)}`)
        : null,
      inst.exact ? null : el("div", { class: "reason" }, inst.inexact_reason || ""),
      inst.overflow_blocks
        ? el("div", { class: "reason overflow", title: "--max-hashes" },
            `${num(inst.overflow_blocks)} stored block(s) not kept: over the cap of ${num(inst.max_keys)} held hashes`)
        : null,
      inst.task && inst.task !== "running"
        ? el("div", { class: "reason task", title: inst.last_task_error || "" },
            `source task ${inst.task} (restarts ${num(inst.task_restarts)})`)
        : null,
      inst.poison_total
        ? el("div", { class: "reason poison", title: JSON.stringify(inst.poison || {}) },
            `${num(inst.poison_total)} poison message(s) refused: ` +
            Object.entries(inst.poison || {}).map(([k, n]) => `${k} ${num(n)}`).join(", "))
        : null,
      inst.silence_hint ? el("div", { class: "reason silence" }, inst.silence_hint) : null,
    );
    container.append(card);
  }
}

/** KV-cache groups (hybrid models: full attention + sliding window), when the
 * stream names them: blocks per group and each group's cache spec. */
function groupsLine(inst) {
  const groups = Object.entries(inst.groups || {}).filter(([g]) => g !== "-");
  const specs = inst.group_specs || {};
  for (const g of Object.keys(specs)) if (!groups.some(([k]) => k === g)) groups.push([g, 0]);
  if (!groups.length) return null;
  groups.sort((a, b) => Number(a[0]) - Number(b[0]));
  const parts = groups.map(([g, n]) => {
    const spec = specs[g] || {};
    const kind = spec.kind ? ` ${spec.kind}${spec.sliding_window ? ` (window ${spec.sliding_window})` : ""}` : "";
    return el("span", { class: "group", "data-group": g }, `g${g}${kind}: ${num(n)} blk`);
  });
  return el("div", { class: "endpoint groups", title: "blocks per KV-cache group (group_idx)" }, "groups ", ...parts.flatMap((p, i) => (i ? [" · ", p] : [p])));
}
