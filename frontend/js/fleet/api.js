// @ts-check
// The observer's REST API and live stream (same origin), on the shared REST
// client (common/api.js: the error shape, the bearer token).  The token comes
// from ?token= or the token box, and is kept in sessionStorage under its own
// key (an observer and a pool service may want different tokens).

import { ApiError, api, bearerProtocols, getToken, setToken, useTokenKey, withParams } from "../common/api.js";

useTokenKey("blockpool.observer.token", { fromUrl: true });

export { ApiError, getToken, setToken };

/**
 * GET (or `method`) path?params as JSON; an ApiError when the answer is not 2xx.
 * @param {string} path
 * @param {Object<string, string | number | boolean | null | undefined>} [params]
 * @param {{method?: string, body?: unknown}} [opts]
 */
export function getJSON(path, params = {}, { method = "GET", body } = {}) {
  return api(method, withParams(path, params), body, { quiet: true });
}

/**
 * An instance as GET /api/fleet and the stream's messages list it: the
 * fields the page's own logic reads (the cards show more).
 * `event_log_seq`: the last event of its log; `state_resets`: times its map
 * started over without an event (both for the page's own copy of the map).
 * @typedef {{name: string, connected: boolean, exact: boolean, stale: boolean, keys: number, events: number, event_log_seq: number, state_resets: number}} FleetInstance
 */

/**
 * An event of the fleet stream's tick: as in GET /api/fleet/{name}/events, plus `instance`.
 * @typedef {object} FleetEvent
 * @property {string} instance
 * @property {string} type BlockStored | BlockRemoved | AllBlocksCleared
 * @property {number} seq its place in the pool's event log (from 1, consecutive per instance)
 * @property {number} batch_seq
 * @property {number} ts
 * @property {string[]} [block_hashes]
 * @property {string | null} [parent_block_hash]
 * @property {number[]} [token_ids] the first 256
 * @property {number} [block_size]
 * @property {number | null} [lora_id]
 * @property {number} [num_tokens]
 * @property {string | null} [lora_name]
 * @property {string | null} [medium]
 * @property {number} [group_idx]
 */

/**
 * A fleet stream message (docs/observer.md).
 * @typedef {{type: "hello", seq: number, ts: number, instances: FleetInstance[]}
 *   | {type: "tick", seq: number, ts: number, instances: FleetInstance[], events: FleetEvent[], events_omitted: number}
 *   | {type: "resync", seq: number}} FleetMessage
 */

/**
 * The live stream: onMessage(msg) for every JSON message, onState(state) with
 * "connecting" | "open" | "retrying" | "auth".  Reconnects with backoff;
 * a gap in seq (or a "resync") calls onResync() so views re-read REST.
 * @param {{onMessage: (msg: FleetMessage) => void, onState: (state: string) => void, onResync: () => void}} handlers
 */
export function openStream({ onMessage, onState, onResync }) {
  /** @type {WebSocket | null} */
  let ws = null;
  /** @type {number | null} */
  let lastSeq = null;
  let delay = 500;
  let stopped = false;

  function connect() {
    if (stopped) return;
    onState("connecting");
    const url = new URL("/api/fleet/stream", location.origin);
    url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    // the token rides in Sec-WebSocket-Protocol, never in the URL (nor a log line)
    ws = new WebSocket(url, bearerProtocols(getToken()));
    ws.onopen = () => {
      delay = 500;
      onState("open");
    };
    ws.onmessage = (ev) => {
      let msg;
      try {
        msg = JSON.parse(ev.data);
      } catch {
        return;
      }
      if (msg.type === "resync" || (msg.type === "tick" && lastSeq !== null && msg.seq !== lastSeq + 1)) {
        onResync();
      }
      if (typeof msg.seq === "number") lastSeq = msg.seq;
      onMessage(msg);
    };
    ws.onclose = (ev) => {
      ws = null;
      lastSeq = null;
      if (stopped) return;
      if (ev.code === 4401) {
        onState("auth");
        return;
      }
      onState("retrying");
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 8000);
    };
    ws.onerror = () => {
      /* onclose follows and schedules the retry */
    };
  }

  connect();
  return {
    reconnect() {
      if (ws) ws.close();
      else connect();
    },
    stop() {
      stopped = true;
      if (ws) ws.close();
    },
  };
}
