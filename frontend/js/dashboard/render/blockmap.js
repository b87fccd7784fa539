// @ts-check
// BlockMap: every block as a cell of a <canvas>, redrawn from dirty ids only.
//
// An ImageData holds the whole map at k x k pixels per block (k = 1 for big
// pools) and is always in step with the model; a full repaint (snapshot,
// resize) is one putImageData.  Between those, a changed block only redraws
// its own cell (one fillRect).  At scale 1 the cells are drawn straight on
// the visible canvas; when the map is scaled (a 1M-block pool is larger than
// the screen, or the user zoomed in) they go to an offscreen canvas holding
// the map at one pixel block per cell, and the visible canvas is one scaled
// drawImage of it.  Highlights live on a second canvas on top, redrawn only
// when they change (mapoverlay.js); the mouse drives hover, select, zoom and
// pan (mapinput.js).  One render() per animation frame; no per-block DOM.
//
// The source is the live model, or a recorded moment (time travel:
// setSource(HistorySource)); the live model keeps taking frames meanwhile
// and the map repaints from it in full on the way back.

import { context2d } from "../../common/dom.js";
import { PACKED, packedColor } from "../../common/palette.js";
import { wireInput } from "./mapinput.js";
import { drawOverlay } from "./mapoverlay.js";

const cssOf = new Map(); // packed colour -> CSS string
/** @param {number} packed */
function css(packed) {
  let c = cssOf.get(packed);
  if (!c) {
    c = `rgb(${packed & 255}, ${(packed >>> 8) & 255}, ${(packed >>> 16) & 255})`;
    cssOf.set(packed, c);
  }
  return c;
}

export class BlockMap {
  /**
   * @param {HTMLCanvasElement} canvas
   * @param {HTMLCanvasElement} overlay
   * @param {import("../state/model.js").PoolModel} model
   */
  constructor(canvas, overlay, model) {
    this.canvas = canvas;
    this.overlay = overlay;
    this.model = model;
    /** @type {import("../state/model.js").PoolModel | import("../state/history.js").HistorySource} what is drawn: the live model or a recorded moment */
    this.src = model;
    // the map is sized by its box in the page (a resize lays it out again)
    const wrap = canvas.parentElement;
    if (!wrap) throw new Error("the block map's canvas is not in the page");
    this.wrap = wrap;
    this.ctx = context2d(canvas, { alpha: false });
    this.octx = context2d(overlay);
    this.off = document.createElement("canvas");
    this.offCtx = context2d(this.off, { alpha: false });
    this.n = -1;
    // the layout (_layout): cell side k, cols x rows cells, scaled down when they outnumber the pixels
    this.k = 0;
    this.cols = 0;
    this.rows = 0;
    this.scale = 1;
    this.gap = 0; // px between cells (k >= 5)
    // the map's pixels, k x k per block (a 1 x 1 placeholder until the first _layout)
    this.img = new ImageData(1, 1);
    this.buf = new Uint32Array(this.img.data.buffer);
    this.offStale = true; // the offscreen canvas lags the ImageData
    this.W = 0;
    this.H = 0;
    this.dpr = 1;
    this.zoom = 1;
    this.panX = 0;
    this.panY = 0;
    this.risk = new Uint8Array(0);
    /** @type {number[]} the blocks drawn at risk now */
    this.riskIds = [];
    /** @type {{selected: number, hover: number, request: number[], hash: number[]}} the highlights (-1: none) */
    this.hl = { selected: -1, hover: -1, request: [], hash: [] };
    this.needLayout = true;
    this.needBlit = true;
    this.needOverlay = true;
    this.perf = { draws: 0, drawMs: 0, lastMs: 0, maxMs: 0, cells: 0, fullPaints: 0 };
    /** @type {((id: number) => void) | null} the block under the pointer (-1: none) */
    this.onhover = null;
    /** @type {((id: number) => void) | null} a click on a block (-1: off the map) */
    this.onselect = null;
    wireInput(this); // hover, select, zoom, pan
    new ResizeObserver(() => {
      this.needLayout = true;
    }).observe(wrap);
  }

  // ------------------------------------------------------------- layout

  _layout() {
    const wrap = this.wrap;
    const dpr = window.devicePixelRatio || 1;
    const W = Math.max(1, Math.floor(wrap.clientWidth * dpr));
    const H = Math.max(1, Math.floor(wrap.clientHeight * dpr));
    const n = Math.max(1, this.src.n);
    for (const c of [this.canvas, this.overlay]) {
      c.width = W;
      c.height = H;
      c.style.width = `${W / dpr}px`;
      c.style.height = `${H / dpr}px`;
    }
    let k = 0;
    let cols = 0;
    for (let kk = 24; kk >= 1; kk--) {
      const c = Math.floor(W / kk);
      if (c > 0 && Math.ceil(n / c) * kk <= H) {
        k = kk;
        cols = c;
        break;
      }
    }
    let scale = 1;
    if (!k) {
      k = 1; // more blocks than pixels: one pixel each, scaled down to fit
      cols = Math.max(1, Math.ceil(Math.sqrt((n * W) / H)));
      const rows = Math.ceil(n / cols);
      scale = Math.min(W / cols, H / rows);
    }
    const rows = Math.ceil(n / cols);
    Object.assign(this, { W, H, dpr, n: this.src.n, k, cols, rows, scale });
    this.gap = k >= 5 ? 1 : 0;
    this.off.width = cols * k;
    this.off.height = rows * k;
    this.img = new ImageData(cols * k, rows * k);
    this.buf = new Uint32Array(this.img.data.buffer);
    if (this.risk.length !== this.model.n) {
      this.risk = new Uint8Array(this.model.n);
      this.riskIds = [];
    }
    this.zoom = 1;
    this.panX = 0;
    this.panY = 0;
    this.needLayout = false;
    this.offStale = true;
    this.ctx.fillStyle = "rgb(13, 17, 23)";
    this.ctx.fillRect(0, 0, W, H);
    this._paintAll();
    this.needBlit = true;
    this.needOverlay = true;
  }

  get effScale() {
    return this.scale * this.zoom;
  }

  get identity() {
    return this.scale === 1 && this.zoom === 1;
  }

  // ------------------------------------------------------------ painting

  /**
   * Draw a recorded moment (a HistorySource), or the live model again (null).
   * @param {import("../state/history.js").HistorySource | null} src
   */
  setSource(src) {
    const next = src || this.model;
    if (next === this.src && !src) return;
    this.src = next;
    if (next === this.model) this.model.fullDirty = true; // everything since, at once
    else this.model.drainDirty(() => {}); // the live changes wait for the way back
    this.needLayout = this.n !== next.n;
    this.needBlit = true;
    this.needOverlay = true;
  }

  get live() {
    return this.src === this.model;
  }

  /** Write a block's pixels into the ImageData; returns its colour. */
  /** @param {number} id */
  _paintCell(id) {
    const m = this.src;
    const color = packedColor(m.state[id], m.refCnt[id], m === this.model ? this.risk[id] : 0);
    const { k, cols, buf } = this;
    const row = (id / cols) | 0;
    const col = id - row * cols;
    if (k === 1) {
      buf[row * cols + col] = color;
    } else {
      const w = cols * k;
      const side = k - this.gap;
      let p = row * k * w + col * k;
      for (let dy = 0; dy < side; dy++, p += w) buf.fill(color, p, p + side);
    }
    return color;
  }

  _paintAll() {
    const m = this.src;
    const n = Math.min(m.n, m.state.length);
    this.buf.fill(PACKED.background);
    if (this.k === 1) {
      const { buf } = this;
      const { state, refCnt } = m;
      const risk = m === this.model ? this.risk : new Uint8Array(n);
      for (let id = 0; id < n; id++) buf[id] = packedColor(state[id], refCnt[id], risk[id]);
    } else {
      for (let id = 0; id < n; id++) this._paintCell(id);
    }
    this._upload();
    this.perf.fullPaints++;
  }

  /** The whole ImageData to where cells are drawn (visible or offscreen canvas). */
  _upload() {
    if (this.identity) {
      this.ctx.putImageData(this.img, 0, 0);
      this.offStale = true;
    } else {
      this.offCtx.putImageData(this.img, 0, 0);
      this.offStale = false;
      this.needBlit = true;
    }
  }

  /** One frame: apply dirty ids, draw their cells, blit when scaled, overlay. */
  render() {
    const t0 = performance.now();
    if (this.needLayout || this.src.n !== this.n) this._layout();
    let cells = 0;
    let full = false;
    if (this.src !== this.model) this.model.drainDirty(() => {}); // live changes: repainted in full on return
    this.src.drainDirty((/** @type {boolean} */ isFull, /** @type {Uint32Array} */ ids, /** @type {number} */ count) => {
      if (isFull || count > this.n / 4) {
        full = true;
        return;
      }
      cells = count;
      const identity = this.identity;
      const ctx = identity ? this.ctx : this.offCtx;
      const { k, cols, n } = this;
      const side = Math.max(1, k - this.gap);
      let last = -1;
      for (let i = 0; i < count; i++) {
        const id = ids[i];
        if (id >= n) continue;
        const color = this._paintCell(id);
        if (color !== last) {
          ctx.fillStyle = css(color);
          last = color;
        }
        const row = (id / cols) | 0;
        ctx.fillRect((id - row * cols) * k, row * k, side, side);
      }
      if (!identity && cells) this.needBlit = true;
    });
    if (full) this._paintAll();
    if (this.needBlit) this._blit();
    if (this.needOverlay) this._drawOverlay();
    const drew = full || cells > 0 || this.needBlit;
    this.needBlit = false;
    const ms = performance.now() - t0;
    if (drew) {
      const p = this.perf;
      p.draws++;
      p.drawMs += ms;
      p.lastMs = ms;
      p.maxMs = Math.max(p.maxMs, ms);
      p.cells += cells;
    }
    return drew;
  }

  _blit() {
    const { ctx, W, H } = this;
    if (this.identity) {
      ctx.fillStyle = "rgb(13, 17, 23)";
      ctx.fillRect(0, 0, W, H);
      ctx.putImageData(this.img, 0, 0);
      return;
    }
    if (this.offStale) {
      this.offCtx.putImageData(this.img, 0, 0);
      this.offStale = false;
    }
    const s = this.effScale;
    ctx.fillStyle = "rgb(13, 17, 23)";
    ctx.fillRect(0, 0, W, H);
    const iw = this.off.width;
    const ih = this.off.height;
    const sw = Math.min(iw - this.panX, W / s);
    const sh = Math.min(ih - this.panY, H / s);
    ctx.imageSmoothingEnabled = s < 1;
    ctx.imageSmoothingQuality = "low";
    if (sw > 0 && sh > 0) ctx.drawImage(this.off, this.panX, this.panY, sw, sh, 0, 0, sw * s, sh * s);
  }

  // ---------------------------------------------------------- geometry

  /** Block id under a point in CSS px of the canvas, or -1. */
  /**
   * @param {number} cssX
   * @param {number} cssY
   */
  hitTest(cssX, cssY) {
    if (this.n <= 0 || !this.k) return -1;
    const s = this.effScale;
    const sx = this.panX + (cssX * this.dpr) / s;
    const sy = this.panY + (cssY * this.dpr) / s;
    const col = Math.floor(sx / this.k);
    const row = Math.floor(sy / this.k);
    if (col < 0 || row < 0 || col >= this.cols || row >= this.rows) return -1;
    const id = row * this.cols + col;
    return id < this.n ? id : -1;
  }

  /** A block's cell in device px of the canvas: {x, y, w, h}. */
  /** @param {number} id */
  cellRect(id) {
    const s = this.effScale;
    const row = Math.floor(id / this.cols);
    const col = id - row * this.cols;
    const x = (col * this.k - this.panX) * s;
    const y = (row * this.k - this.panY) * s;
    const side = Math.max(this.k - this.gap, 1) * s;
    return { x, y, w: side, h: side };
  }

  /** Centre of a block's cell in CSS px relative to the page (tests click it). */
  /** @param {number} id */
  cellCenterPage(id) {
    const r = this.cellRect(id);
    const box = this.canvas.getBoundingClientRect();
    return { x: box.left + (r.x + r.w / 2) / this.dpr, y: box.top + (r.y + r.h / 2) / this.dpr };
  }

  // --------------------------------------------------------- highlights

  /** Cached blocks about to be evicted (drawn in the risk colour). */
  /** @param {number[]} ids */
  setRisk(ids) {
    if (this.risk.length !== this.model.n) return;
    const risk = this.risk;
    const m = this.model;
    // 2 = in the new set; only blocks whose flag flips are redrawn
    for (const id of ids) risk[id] = risk[id] === 1 ? 3 : 2;
    for (const id of this.riskIds) {
      if (risk[id] === 1) {
        risk[id] = 0;
        m.touchOne(id);
      }
    }
    for (const id of ids) {
      if (risk[id] === 2) m.touchOne(id);
      risk[id] = 1;
    }
    this.riskIds = ids;
  }

  /**
   * @template {"selected" | "hover" | "request" | "hash"} K
   * @param {K} part
   * @param {BlockMap["hl"][K]} value
   */
  setHighlight(part, value) {
    this.hl[part] = value;
    this.needOverlay = true;
  }

  _drawOverlay() {
    this.needOverlay = false;
    drawOverlay(this);
  }

  // ------------------------------------------------------------- zoom, pan

  /**
   * Zoom to `z` keeping the map point under (x, y) (device px of the canvas) in place.
   * @param {number} x
   * @param {number} y
   * @param {number} z
   */
  zoomAt(x, y, z) {
    const zMax = Math.max(1, 32 / (this.k * this.scale));
    const nz = Math.min(Math.max(z, 1), zMax);
    const s0 = this.effScale;
    const sx = this.panX + x / s0;
    const sy = this.panY + y / s0;
    this.zoom = nz;
    const s1 = this.effScale;
    this.panTo(sx - x / s1, sy - y / s1);
  }

  /** Pan to (px, py) in map pixels, clamped to the map (none at zoom 1). */
  /**
   * @param {number} px
   * @param {number} py
   */
  panTo(px, py) {
    const s = this.effScale;
    const maxX = Math.max(0, this.off.width - this.W / s);
    const maxY = Math.max(0, this.off.height - this.H / s);
    this.panX = Math.min(Math.max(px, 0), maxX);
    this.panY = Math.min(Math.max(py, 0), maxY);
    if (this.zoom === 1) {
      this.panX = 0;
      this.panY = 0;
    }
    this.needBlit = true;
    this.needOverlay = true;
  }
}
