// @ts-check
// Number, duration, size and hash formatting, shared by the dashboard and the
// fleet page.

const nf = new Intl.NumberFormat("en-US");

/** @param {number | null | undefined} n */
export function int(n) {
  return n === null || n === undefined || Number.isNaN(n) ? "—" : nf.format(Math.round(n));
}

/**
 * @param {number | null | undefined} x a fraction (0.5: "50.0%")
 * @param {number} [digits]
 */
export function pct(x, digits = 1) {
  return x === null || x === undefined || !Number.isFinite(x) ? "—" : `${(x * 100).toFixed(digits)}%`;
}

/** @param {number | null | undefined} x */
export function rate(x) {
  if (x === null || x === undefined || !Number.isFinite(x)) return "—";
  return x >= 100 ? nf.format(Math.round(x)) : x.toFixed(1);
}

/**
 * Seconds as a short duration: 850ms, 12.3s, 4m05s, 2h10m.
 * @param {number | null | undefined} s
 */
export function dur(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return "—";
  if (s < 1) return `${Math.round(s * 1000)}ms`;
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(Math.floor(s % 60)).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
}

/**
 * Seconds as an axis tick: 5ms, 250ms, 30s, 2m, 1.5h (three digits at most).
 * @param {number | null | undefined} s
 */
export function durTick(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return "—";
  const p = (/** @type {number} */ v) => String(Number(v.toPrecision(3)));
  if (s < 1) return `${p(s * 1000)}ms`;
  if (s < 60) return `${p(s)}s`;
  if (s < 3600) return `${p(s / 60)}m`;
  return `${p(s / 3600)}h`;
}

/** @param {number} n */
export function bytes(n) {
  if (!Number.isFinite(n)) return "—";
  const u = ["B", "KB", "MB", "GB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) {
    n /= 1024;
    i++;
  }
  return `${n.toFixed(i && n < 10 ? 1 : 0)} ${u[i]}`;
}

/**
 * A hash as shown: its first `n` hex digits, "…" when cut (the title holds all of it).
 * @param {string | null | undefined} h
 * @param {number} [n]
 */
export function shortHash(h, n = 8) {
  if (h === null || h === undefined || h === "") return "—";
  return h.length > n ? `${h.slice(0, n)}…` : h;
}

/**
 * How long ago, in words: "now", "12 s ago", "3 min ago", "2 h ago"; null: "never".
 * @param {number | null | undefined} seconds
 */
export function age(seconds) {
  if (seconds === null || seconds === undefined) return "never";
  if (seconds < 1) return "now";
  if (seconds < 60) return `${Math.round(seconds)} s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  return `${Math.round(seconds / 3600)} h ago`;
}

/**
 * Token ids as text, "…(total)" when only the first ones are known.
 * @param {number[] | null | undefined} tokens
 * @param {number} total
 */
export function tokensText(tokens, total) {
  const shown = (tokens || []).join(" ");
  return total > (tokens || []).length ? `${shown} …(${total})` : shown;
}

const two = (/** @type {number} */ n) => String(n).padStart(2, "0");

/**
 * Unix seconds as this browser's clock time, 14:05:30 (an axis tick, a
 * moment in a table); `unknown` for a time not known (an axis: no label).
 * @param {number | null | undefined} t
 */
export function clockText(t, unknown = "") {
  if (t === null || t === undefined || !Number.isFinite(t)) return unknown;
  const d = new Date(t * 1000);
  return `${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}`;
}

/**
 * A number in a few characters (12k, 1.5M, 0.3; a legend, a small axis).
 * @param {number | null | undefined} v
 */
export function compact(v) {
  if (v === null || v === undefined || !Number.isFinite(v)) return "—";
  const a = Math.abs(v);
  if (a >= 1e6) return `${(v / 1e6).toFixed(1)}M`;
  if (a >= 1e4) return `${Math.round(v / 1e3)}k`;
  if (a >= 1e3) return `${(v / 1e3).toFixed(1)}k`;
  if (a >= 10 || v === Math.round(v)) return String(Math.round(v));
  return v.toFixed(1);
}
