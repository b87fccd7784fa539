// @ts-check
// REST client of the dashboard and the fleet page: the bearer token (kept in
// sessionStorage) and the error shape {"error": {"status", "code", "message",
// "details"}}.

let tokenKey = "blockpool.token";
let tokenFromUrl = false;

/**
 * The page's token slot: its sessionStorage key, and whether ?token= overrides it.
 * @param {string} key
 * @param {{fromUrl?: boolean}} [opts]
 */
export function useTokenKey(key, { fromUrl = false } = {}) {
  tokenKey = key;
  tokenFromUrl = fromUrl;
}

/** A refused or failed call: the HTTP status (0: no answer), the error shape's code and details. */
export class ApiError extends Error {
  /**
   * @param {number} status
   * @param {string} code
   * @param {string} message
   * @param {Record<string, unknown> | null | undefined} details
   */
  constructor(status, code, message, details) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details || {};
  }
}

export function getToken() {
  if (tokenFromUrl) {
    const fromUrl = new URLSearchParams(location.search).get("token");
    if (fromUrl) return fromUrl;
  }
  try {
    return sessionStorage.getItem(tokenKey) || "";
  } catch {
    return "";
  }
}

/** @param {string} token "" forgets it */
export function setToken(token) {
  try {
    if (token) sessionStorage.setItem(tokenKey, token);
    else sessionStorage.removeItem(tokenKey);
  } catch {
    /* storage disabled: the token lives for this page only */
  }
}

/**
 * path?k=v&… for the params that have a value.
 * @param {string} path
 * @param {Record<string, unknown> | null} [params]
 */
export function withParams(path, params = {}) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== undefined && v !== null && v !== "") q.set(k, String(v));
  }
  const qs = q.toString();
  return qs ? `${path}${path.includes("?") ? "&" : "?"}${qs}` : path;
}

/** @type {((err: ApiError) => void)[]} */
const listeners = [];

/**
 * fn(err) for every failed background call (GETs; POSTs report to their control).
 * @param {(err: ApiError) => void} fn
 */
export function onApiError(fn) {
  listeners.push(fn);
}

/**
 * One call: the answer's JSON (null when empty); an ApiError when refused or
 * unreachable (reported to onApiError's listeners unless `quiet`).
 * @param {string} method
 * @param {string} path
 * @param {unknown} [body] sent as JSON
 * @param {{quiet?: boolean}} [opts]
 */
export async function api(method, path, body, { quiet = false } = {}) {
  /** @type {Record<string, string>} */
  const headers = { Accept: "application/json" };
  const token = getToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  /** @type {RequestInit} */
  const init = { method, headers };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (exc) {
    const err = new ApiError(0, "network", `${method} ${path}: ${exc.message || exc}`, {});
    if (!quiet) for (const fn of listeners) fn(err);
    throw err;
  }
  let data = null;
  const text = await resp.text();
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = { raw: text };
    }
  }
  if (!resp.ok) {
    const e = (data && data.error) || {};
    const err = new ApiError(resp.status, e.code || `http_${resp.status}`, e.message || resp.statusText, e.details);
    if (!quiet) for (const fn of listeners) fn(err);
    throw err;
  }
  return data;
}

export const get = (/** @type {string} */ path) => api("GET", path);
/**
 * A POST that reports only to its caller (its control shows the outcome).
 * @param {string} path
 * @param {unknown} [body] sent as JSON ({} when none)
 */
export const post = (path, body) => api("POST", path, body === undefined ? {} : body, { quiet: true });

/**
 * The websocket subprotocols that carry a bearer token without putting it in
 * the URL: "blockpool" (the one a server echoes) and "base64url.bearer.<t>"
 * (base64url of the token's UTF-8 bytes: any text fits a header).
 * @param {string} token
 */
export function bearerProtocols(token) {
  if (!token) return ["blockpool"];
  const bytes = new TextEncoder().encode(token);
  const b64 = btoa(String.fromCharCode(...bytes)).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  return ["blockpool", `base64url.bearer.${b64}`];
}
