// @ts-check
// The fleet observer page: instances with their stream health, the selected
// instance's hash map and prefix tree, the fleet prefix view and the live
// event log -- all from `blockpool observe`'s REST API and websocket.  The
// selected instance's map and tree follow the dashboard's sync model: one
// snapshot, then the stream's events (fleet/sync.js), no polling.

import { observeHint } from "../common/observe.js";
import { TreeView } from "../common/treeview.js";
import { getJSON, getToken, openStream, setToken } from "./api.js";
import { $, clear, h, int, tokensText } from "./dom.js";
import { EventLog } from "./events.js";
import { HashMapView } from "./hashmap.js";
import { renderInstances } from "./instances.js";
import { PrefixView } from "./prefixes.js";
import { RateChart } from "./rate.js";
import { InstanceSync } from "./sync.js";

/** @typedef {import("./api.js").FleetInstance} FleetInstance */

/**
 * The page's state: the instances last listed, the one selected (its name),
 * and the live stream once opened.
 * @type {{instances: FleetInstance[], selected: string | null, stream: ReturnType<typeof openStream> | null}}
 */
const state = { instances: [], selected: null, stream: null };

/**
 * The page's error line: an ApiError (its status and code say more), any
 * other error, or null to hide it.
 * @param {{message: string, status?: number, code?: string} | null} err
 */
function showError(err) {
  const box = $("page-error");
  if (!err) {
    box.hidden = true;
    return;
  }
  box.hidden = false;
  box.textContent = err.status === 404 && err.code === "not_found" && !state.instances.length
    ? "No observer API here: start one with `blockpool observe tcp://host:port …` and open its page."
    : `${err.message}`;
  if (err.status === 404 && !state.instances.length) poolHint(box);
  if (err.status === 401) $("token").classList.add("need");
}

/** Opened on a pool server: say how to observe this one (its KV-event endpoint). */
/** @param {HTMLElement} box */
async function poolHint(box) {
  try {
    const hint = observeHint(await getJSON("/api/kv-events"), location.hostname);
    box.textContent = hint
      ? `This is a blockpool pool server, not an observer: ${hint.text}.`
      : "This is a blockpool pool server that publishes no KV events (start it with --kv-events), and no observer runs here.";
  } catch {
    /* not a pool server either: the first message stands */
  }
}

const prefixes = new PrefixView({ onError: showError });
const hashmap = new HashMapView({ onPick: (hash) => prefixes.pick(hash) });
const treeView = new TreeView({
  body: $("tree"),
  stats: $("tree-info"),
  onChain: (hashes) => prefixes.pick(hashes[hashes.length - 1]), // the deepest: who holds that whole prefix
  describe: (hash) => {
    const e = sync.map.entries.get(hash);
    if (!e) return "";
    return `[${tokensText(e.tokens, e.num_tokens)}]${e.lora_name ? ` · ${e.lora_name}` : ""}`;
  },
  empty: "no cached blocks seen yet",
});
const log = new EventLog();
const rate = new RateChart($("rate-chart"));

// Draw the selected instance's copy when it changed: the hash map at most
// every 250 ms, the tree (a build over every held hash) at most once a
// second, however fast the events come (ticks are 5 a second).
let drawPending = false;
let mapDirty = true;
let treeDirty = true;
let treeDrawnAt = -Infinity;
let treeTimer = false;
/** @type {boolean | null} the exact badge last drawn */
let drawnExact = null;
function draw() {
  drawPending = false;
  const me = state.instances.find((i) => i.name === state.selected);
  const exact = !!(me && me.exact && !me.stale);
  if (mapDirty || exact !== drawnExact) {
    mapDirty = false;
    drawnExact = exact;
    hashmap.show(sync.map, exact);
  }
  if (sync.map.logSeq === null) {
    $("tree").replaceChildren(h("div", { class: "muted" }, "reading…"));
    return;
  }
  $("sync-state").textContent = `snapshot reads ${sync.reads} (last: ${sync.lastReason}) · event #${int(sync.map.logSeq)}`;
  if (!treeDirty) return;
  const wait = treeDrawnAt + 1000 - performance.now();
  if (wait > 0) {
    if (!treeTimer) {
      treeTimer = true;
      setTimeout(() => {
        treeTimer = false;
        scheduleDraw();
      }, wait);
    }
    return;
  }
  treeDirty = false;
  treeDrawnAt = performance.now();
  treeView.render(sync.tree, (hash) => sync.map.copies(hash));
}
function scheduleDraw() {
  if (drawPending) return;
  drawPending = true;
  setTimeout(draw, 250);
}
function changed() {
  mapDirty = true;
  treeDirty = true;
  scheduleDraw();
}

const sync = new InstanceSync({
  read: (name) => getJSON(`/api/fleet/${encodeURIComponent(name)}/snapshot`),
  onChange: changed,
  onError: showError,
});
$("tree-refresh").addEventListener("click", () => sync.reread("refresh"));

/** @param {string} name */
function select(name) {
  if (name === state.selected) return;
  state.selected = name;
  const url = new URL(location.href);
  url.searchParams.set("instance", name);
  history.replaceState(null, "", url);
  renderInstances($("instances"), state.instances, name, select);
  hashmap.select(name);
  $("tree-instance").textContent = name;
  sync.select(name);
  log.select(name);
}

/** @param {FleetInstance[]} instances */
function setInstances(instances) {
  state.instances = instances;
  $("instance-count").textContent = `${instances.length}`;
  const connected = instances.filter((i) => i.connected).length;
  const exact = instances.filter((i) => i.exact && !i.stale).length;
  const stale = instances.filter((i) => i.stale).length;
  const keys = instances.reduce((a, i) => a + i.keys, 0);
  $("fleet-facts").textContent = `${instances.length} instance(s) · ${connected} connected · ${exact} exact · ${stale ? `${stale} stale · ` : ""}${int(keys)} hashes held`;
  renderInstances($("instances"), instances, state.selected, select);
}

// The fleet-wide families stay on REST: they are a walk over every pool's
// map on the server, which the page does not hold (it copies the selected
// instance's only).  Read on demand (the panel's refresh button) and, when
// events came, at most every 30 s.
let familiesDirty = false;
setInterval(() => {
  if (!familiesDirty) return;
  familiesDirty = false;
  prefixes.families();
}, 30000);

async function boot() {
  const fleet = await getJSON("/api/fleet");
  showError(null);
  $("token").classList.remove("need");
  const list = $("cannot-know-list");
  clear(list);
  for (const line of fleet.cannot_know) list.append(h("li", {}, line));
  setInstances(fleet.instances);
  const wanted = new URLSearchParams(location.search).get("instance");
  const first = fleet.instances.find((/** @type {FleetInstance} */ i) => i.name === wanted) || fleet.instances[0];
  if (first) select(first.name);
  prefixes.families();
  if (!state.stream) {
    // what this page lost of the stream (too slow, or a gap) is counted and
    // shown; the selected instance's map is read again (fleet/sync.js)
    let resyncs = 0;
    let opened = false;
    const showStream = () => {
      const box = $("stream-state");
      const s = box.dataset.state;
      box.textContent = `stream: ${s}${resyncs ? ` · ${resyncs} resync${resyncs > 1 ? "s" : ""}` : ""}`;
      box.title = resyncs ? "messages were dropped (this page fell behind, or a gap): the views were re-read" : "";
    };
    state.stream = openStream({
      onState: (s) => {
        $("stream-state").dataset.state = s;
        showStream();
        if (s === "auth") $("token").classList.add("need");
        if (s === "open") {
          if (opened) sync.reread("reconnected"); // what came while away is not in the stream
          opened = true;
        }
      },
      onResync: () => {
        resyncs += 1;
        showStream();
        sync.reread("resync");
      },
      onMessage: (msg) => {
        if ("instances" in msg) setInstances(msg.instances);
        if (msg.type === "tick") {
          rate.update(msg.ts, msg.instances);
          log.add(msg.events);
          sync.tick(msg.events, msg.instances);
          if (msg.events.length) familiesDirty = true;
        }
        scheduleDraw(); // the exact badge follows the health
      },
    });
  }
}

$("token", HTMLInputElement).value = getToken();
$("token").addEventListener("change", () => {
  setToken($("token", HTMLInputElement).value.trim());
  const url = new URL(location.href);
  if (url.searchParams.has("token")) {
    url.searchParams.delete("token"); // the box wins over the address from now on
    history.replaceState(null, "", url);
  }
  if (state.stream) state.stream.reconnect();
  boot().catch(showError);
});

boot().catch(showError);
