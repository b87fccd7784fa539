// Small formatting and DOM helpers shared by the panels.

const nf = new Intl.NumberFormat("en-US");

export function int(n) {
  return n === null || n === undefined || Number.isNaN(n) ? "—" : nf.format(Math.round(n));
}

export function pct(x, digits = 1) {
  return x === null || x === undefined || !Number.isFinite(x) ? "—" : `${(x * 100).toFixed(digits)}%`;
}

export function rate(x) {
  if (x === null || x === undefined || !Number.isFinite(x)) return "—";
  return x >= 100 ? nf.format(Math.round(x)) : x.toFixed(1);
}

/** Seconds as a short duration: 850ms, 12.3s, 4m05s, 2h10m. */
export function dur(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return "—";
  if (s < 1) return `${Math.round(s * 1000)}ms`;
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(Math.floor(s % 60)).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
}

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

export function shortHash(h, n = 8) {
  return h ? `${h.slice(0, n)}…` : "—";
}

/** document.getElementById that fails loudly. */
export function $(id) {
  const el = document.getElementById(id);
  if (!el) throw new Error(`#${id} is missing from the page`);
  return el;
}

/** Build an element: h("td", {class: "num", title: "x"}, "text" | Node, ...). */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "dataset") Object.assign(el.dataset, v);
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? "" : v);
    }
  }
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** Set text only when it changed (cheap repeated updates). */
export function setText(el, text) {
  const t = String(text);
  if (el.textContent !== t) el.textContent = t;
}

/** Runs fn at most every `ms` (from a rAF loop): returns true when it ran. */
export class Every {
  constructor(ms) {
    this.ms = ms;
    this.last = -Infinity;
    this.cost = 0;
  }

  due(now) {
    return now - this.last >= Math.max(this.ms, this.cost * 10);
  }

  run(now, fn) {
    if (!this.due(now)) return false;
    this.last = now;
    const t0 = performance.now();
    fn();
    this.cost = performance.now() - t0;
    return true;
  }
}
