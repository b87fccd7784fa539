// Small DOM and formatting helpers.  Text from the streams (instance names,
// LoRA names, media) is untrusted: it only ever goes in through textContent.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on") && typeof v === "function") node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
}

export const $ = (id) => document.getElementById(id);

/** A hash as shown: the first 12 hex digits (the title holds all of it). */
export function shortHash(h) {
  if (h === null || h === undefined) return "—";
  return h.length > 12 ? `${h.slice(0, 12)}…` : h;
}

export function hashCell(h) {
  return el("td", { class: "hash", title: h || "" }, shortHash(h));
}

export function num(n) {
  if (n === null || n === undefined) return "—";
  return Number(n).toLocaleString("en-US");
}

export function age(seconds) {
  if (seconds === null || seconds === undefined) return "never";
  if (seconds < 1) return "now";
  if (seconds < 60) return `${Math.round(seconds)} s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  return `${Math.round(seconds / 3600)} h ago`;
}

export function tokensText(tokens, total) {
  const shown = (tokens || []).join(" ");
  return total > (tokens || []).length ? `${shown} …(${total})` : shown;
}

export function debounce(fn, ms) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}
