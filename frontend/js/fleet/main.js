// @ts-check
// The fleet observer page: instances with their stream health, the selected
// instance's hash map and prefix tree, the fleet prefix view and the live
// event log -- all from `blockpool observe`'s REST API and websocket.

import { observeHint } from "../common/observe.js";
import { getJSON, getToken, openStream, setToken } from "./api.js";
import { $, clear, h, int } from "./dom.js";
import { EventLog } from "./events.js";
import { HashMapView } from "./hashmap.js";
import { renderInstances } from "./instances.js";
import { PrefixView } from "./prefixes.js";
import { RateChart } from "./rate.js";
import { TreeView } from "./tree.js";

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
const hashmap = new HashMapView({ onPick: (hash) => prefixes.pick(hash), onError: showError });
const tree = new TreeView({ onPick: (hash) => prefixes.pick(hash), onError: showError });
const log = new EventLog();
const rate = new RateChart($("rate-chart"));

/** @param {string} name */
function select(name) {
  if (name === state.selected) return;
  state.selected = name;
  const url = new URL(location.href);
  url.searchParams.set("instance", name);
  history.replaceState(null, "", url);
  renderInstances($("instances"), state.instances, name, select);
  hashmap.select(name);
  tree.select(name);
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

// Refresh the views when events arrive: the selected instance's every 2 s at
// most, the fleet-wide families (a walk over every pool) every 10 s at most.
let dirty = false;
let familiesDirty = false;
setInterval(() => {
  if (!dirty) return;
  dirty = false;
  familiesDirty = true;
  hashmap.load();
  tree.load();
}, 2000);
setInterval(() => {
  if (!familiesDirty) return;
  familiesDirty = false;
  prefixes.families();
}, 10000);

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
    // what this page lost of the stream (too slow, or a gap) is counted and shown
    let resyncs = 0;
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
      },
      onResync: () => {
        dirty = true;
        resyncs += 1;
        showStream();
      },
      onMessage: (msg) => {
        if ("instances" in msg) setInstances(msg.instances);
        if (msg.type === "tick") {
          rate.update(msg.ts, msg.instances);
          log.add(msg.events);
          if (msg.events.length) dirty = true;
        }
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
