// @ts-check
// DOM helpers shared by the dashboard and the fleet page: lookup, element
// building, cheap text updates, and the timing helpers of a rAF loop.

/**
 * document.getElementById that fails loudly; with `kind` (HTMLInputElement,
 * HTMLCanvasElement, ...) also when the element is of another kind, and typed
 * as that kind.
 * @template {HTMLElement} [T=HTMLElement]
 * @param {string} id
 * @param {new () => T} [kind]
 * @returns {T}
 */
export function $(id, kind) {
  const el = document.getElementById(id);
  if (!el) throw new Error(`#${id} is missing from the page`);
  if (kind && !(el instanceof kind)) throw new Error(`#${id} is a <${el.tagName.toLowerCase()}>, not a ${kind.name}`);
  return /** @type {T} */ (el);
}

/**
 * canvas.getContext("2d") that fails loudly: it is null only when the canvas
 * already holds a context of another kind (webgl, bitmaprenderer).
 * @param {HTMLCanvasElement} canvas
 * @param {CanvasRenderingContext2DSettings} [settings]
 * @returns {CanvasRenderingContext2D}
 */
export function context2d(canvas, settings) {
  const ctx = canvas.getContext("2d", settings);
  if (!ctx) throw new Error(`${canvas.id ? `#${canvas.id}` : "a canvas"} already holds another kind of context`);
  return ctx;
}

/**
 * Build an element: h("td", {class: "num", title: "x"}, "text" | Node | [..], ...).
 * Text (from the streams too: instance names, LoRA names) only ever goes in
 * as text nodes or textContent, never as markup.  An attribute that is null,
 * undefined or false is left out; true sets it empty.
 * @template {string} K
 * @param {K} tag
 * @param {Record<string, unknown> | null} [attrs]
 * @param {...unknown} children
 * @returns {K extends keyof HTMLElementTagNameMap ? HTMLElementTagNameMap[K] : HTMLElement}
 */
export function h(tag, attrs, ...children) {
  // createElement gives the tag's own element type (an unknown tag: HTMLElement)
  const el = /** @type {K extends keyof HTMLElementTagNameMap ? HTMLElementTagNameMap[K] : HTMLElement} */ (document.createElement(tag));
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = String(v);
      else if (k === "text") el.textContent = String(v);
      else if (k === "dataset") Object.assign(el.dataset, v);
      else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), /** @type {EventListener} */ (v));
      else el.setAttribute(k, v === true ? "" : String(v));
    }
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/**
 * Remove every child.
 * @param {Node} node
 */
export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
}

/**
 * Set text only when it changed (cheap repeated updates).
 * @param {Node} el
 * @param {unknown} text
 */
export function setText(el, text) {
  const t = String(text);
  if (el.textContent !== t) el.textContent = t;
}

/** Runs fn at most every `ms` (from a rAF loop): returns true when it ran. */
export class Every {
  /** @param {number} ms */
  constructor(ms) {
    this.ms = ms;
    this.last = -Infinity;
    this.cost = 0;
  }

  /** @param {number} now */
  due(now) {
    return now - this.last >= Math.max(this.ms, this.cost * 10);
  }

  /**
   * @param {number} now
   * @param {() => void} fn
   */
  run(now, fn) {
    if (!this.due(now)) return false;
    this.last = now;
    const t0 = performance.now();
    fn();
    this.cost = performance.now() - t0;
    return true;
  }
}

/**
 * fn, called once `ms` after the last of a burst of calls.
 * @template {unknown[]} A
 * @param {(...args: A) => void} fn
 * @param {number} ms
 * @returns {(...args: A) => void}
 */
export function debounce(fn, ms) {
  /** @type {number | undefined} */
  let timer;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}
