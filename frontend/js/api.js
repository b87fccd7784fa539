// REST client: the bearer token (kept in sessionStorage) and the error shape
// {"error": {"status", "code", "message", "details"}}.

const TOKEN_KEY = "blockpool.token";

export class ApiError extends Error {
  constructor(status, code, message, details) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details || {};
  }
}

export function getToken() {
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

const listeners = [];

/** fn(err) for every failed background call (GETs; POSTs report to their control). */
export function onApiError(fn) {
  listeners.push(fn);
}

export async function api(method, path, body, { quiet = false } = {}) {
  const headers = { Accept: "application/json" };
  const token = getToken();
  if (token) headers.Authorization = `Bearer ${token}`;
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

export const get = (path) => api("GET", path);
export const post = (path, body) => api("POST", path, body === undefined ? {} : body, { quiet: true });
