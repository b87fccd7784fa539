// The observer's REST API and live stream (same origin).  The bearer token
// comes from ?token= or the token box, and is kept in sessionStorage.

const TOKEN_KEY = "blockpool.observer.token";

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export function getToken() {
  const fromUrl = new URLSearchParams(location.search).get("token");
  if (fromUrl) return fromUrl;
  try {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  } catch {
    return "";
  }
}

export function setToken(token) {
  try {
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch {
    /* storage disabled: the token lives for this page only */
  }
}

export async function getJSON(path, params = {}, { method = "GET", body } = {}) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== "") url.searchParams.set(k, String(v));
  }
  const headers = { Accept: "application/json" };
  const token = getToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(url, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let data = null;
  try {
    data = await resp.json();
  } catch {
    data = null;
  }
  if (!resp.ok) {
    const e = (data && data.error) || {};
    throw new ApiError(resp.status, e.code || "error", e.message || `HTTP ${resp.status}`);
  }
  return data;
}

/**
 * The live stream: onMessage(msg) for every JSON message, onState(state) with
 * "connecting" | "open" | "retrying" | "auth".  Reconnects with backoff;
 * a gap in seq (or a "resync") calls onResync() so views re-read REST.
 */
export function openStream({ onMessage, onState, onResync }) {
  let ws = null;
  let lastSeq = null;
  let delay = 500;
  let stopped = false;

  function connect() {
    if (stopped) return;
    onState("connecting");
    const url = new URL("/api/fleet/stream", location.origin);
    url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    const token = getToken();
    if (token) url.searchParams.set("token", token);
    ws = new WebSocket(url);
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
