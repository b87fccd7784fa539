// @ts-check
// The instance selector: one card per observed stream, with its health.

import { age, clear, h, int } from "./dom.js";

export function renderInstances(container, instances, selected, onSelect) {
  clear(container);
  for (const inst of instances) {
    // a stale pool's map is the last one heard: "exact" would claim too much
    const exact = inst.stale
      ? h("span", { class: "badge stale", title: inst.stale_hint || "" }, "stale")
      : inst.exact
        ? h("span", { class: "badge exact", title: "every batch since seq 0 (or a clear) applied" }, "exact")
        : h("span", { class: "badge inexact", title: inst.inexact_reason || "" }, "inexact");
    const stat = (label, value, title) => h("span", { title: title || "" }, h("i", {}, `${label} `), value);
    const card = h(
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
      h(
        "div",
        { class: "top" },
        h("span", { class: inst.connected ? "dot on" : "dot", title: inst.connected ? "connected" : "disconnected" }),
        h("span", { class: "name" }, inst.name),
        h("span", { class: "spacer" }),
        inst.dashboard_url
          ? h("a", { class: "dashboard-link", href: inst.dashboard_url, target: "_blank", rel: "noopener", title: "this engine's own dashboard (blockpool serve --mirror): block map, LRU queue, miss reasons, …", onclick: (ev) => ev.stopPropagation() }, "dashboard ↗")
          : null,
        exact,
      ),
      h(
        "div",
        { class: "endpoint" },
        inst.mode === "bind" ? `bound ${inst.endpoint}` : inst.endpoint,
        inst.replay_endpoint ? ` · replay ${inst.replay_endpoint}` : " · no replay",
        inst.ranks_seen && inst.ranks_seen.length ? ` · dp ${inst.ranks_seen.join(",")}` : "",
      ),
      h(
        "div",
        { class: "stats" },
        stat("keys", int(inst.keys), "hashes held"),
        stat("blocks", int(inst.blocks), "copies of held hashes"),
        stat("seq", inst.last_seq === null ? "—" : int(inst.last_seq), "last publisher seq applied"),
        stat("batches", int(inst.batches)),
        stat("events", int(inst.events)),
        stat("gaps", int(inst.gaps), "sequence gaps detected"),
        stat("replays", int(inst.replays), "replay requests"),
        stat("failed", int(inst.replay_failures), "replays that failed or fell short"),
        stat("missed", int(inst.missed), "batches lost for good"),
        stat("restarts", int(inst.restarts), "publisher restarts (seq went back)"),
        stat("dups", int(inst.duplicates), "batches seen twice (replay and live)"),
        stat("last", age(inst.last_batch_age_s), "last batch applied"),
      ),
      groupsLine(inst),
      inst.stale ? h("div", { class: "reason stale" }, inst.stale_hint || "stale") : null,
      !inst.stale && inst.idle
        ? h("div", { class: "note idle", title: "connected; nothing changed, the map stands" },
            `idle: connected, last message ${age(inst.silent_s)}`)
        : null,
      inst.exact || inst.stale ? null : h("div", { class: "reason" }, inst.inexact_reason || ""),
      inst.overflow_blocks
        ? h("div", { class: "reason overflow", title: "--max-hashes" },
            `${int(inst.overflow_blocks)} stored block(s) not kept: over the cap of ${int(inst.max_keys)} held hashes`)
        : null,
      inst.task && inst.task !== "running"
        ? h("div", { class: "reason task", title: inst.last_task_error || "" },
            `source task ${inst.task} (restarts ${int(inst.task_restarts)})`)
        : null,
      inst.poison_total
        ? h("div", { class: "reason poison", title: JSON.stringify(inst.poison || {}) },
            `${int(inst.poison_total)} poison message(s) refused: ` +
            Object.entries(inst.poison || {}).map(([k, n]) => `${k} ${int(n)}`).join(", "))
        : null,
      inst.refused_messages
        ? h("div", { class: "reason refused", title: "over --bind, the instance's publisher is the connection that sent first; another's messages are refused (docs/observer.md)" },
            `${int(inst.refused_messages)} message(s) from ${int(inst.refused_publishers)} other publisher connection(s) refused`)
        : null,
      inst.silence_hint ? h("div", { class: "reason silence" }, inst.silence_hint) : null,
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
    return h("span", { class: "group", "data-group": g }, `g${g}${kind}: ${int(n)} blk`);
  });
  return h("div", { class: "endpoint groups", title: "blocks per KV-cache group (group_idx)" }, "groups ", ...parts.flatMap((p, i) => (i ? [" · ", p] : [p])));
}
