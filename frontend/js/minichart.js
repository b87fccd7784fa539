// MiniChart: the analysis row's small canvas charts (time series stacked or
// as lines, on one or two y axes; bar histograms; an x-y curve), drawn in
// the style of the uPlot charts above them (axis colour, grid, 11 px font).
// They draw only when their data changes or on hover, never per animation
// frame; a legend line under each shows the values at the cursor (or the
// latest).

const AXIS = "#8b949e";
const GRID = "rgba(139, 148, 158, 0.12)";
const FONT = "11px ui-sans-serif, system-ui, sans-serif";

export const rgba = ([r, g, b], a = 1) => `rgba(${r}, ${g}, ${b}, ${a})`;

export const hms = (t) => {
  const d = new Date(t * 1000);
  return `${String(d.getHours()).padStart(2, "0")}:${String(d.getMinutes()).padStart(2, "0")}:${String(d.getSeconds()).padStart(2, "0")}`;
};

export const compact = (v) => {
  if (v === null || v === undefined || !Number.isFinite(v)) return "—";
  const a = Math.abs(v);
  if (a >= 1e6) return `${(v / 1e6).toFixed(1)}M`;
  if (a >= 1e4) return `${Math.round(v / 1e3)}k`;
  if (a >= 1e3) return `${(v / 1e3).toFixed(1)}k`;
  if (a >= 10 || v === Math.round(v)) return String(Math.round(v));
  return v.toFixed(1);
};

/** Nice round ticks covering [lo, hi], about n of them. */
export function niceTicks(lo, hi, n = 4) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / Math.max(1, n);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) || 10 * mag;
  const out = [];
  for (let v = Math.ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step) out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
  return out;
}

function niceMax(v) {
  if (!(v > 0)) return 1;
  const t = niceTicks(0, v, 4);
  const step = t.length > 1 ? t[1] - t[0] : v;
  return Math.ceil(v / step - 1e-9) * step;
}

const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600];

/**
 * new MiniChart(el, {
 *   height, x: "time" | "num" | "cat", xLog2, xFmt(v), xTicks: [values],
 *   y: {fmt, range(lo, hi) -> [a, b]}, y2: {fmt, range, color},
 *   series: [{label, rgb, fill (alpha), width, stack, axis: 2, bars, points, dash, fmt}],
 *   legend: true, legendIdx(xs) -> the index shown without a cursor (default: the last),
 *   empty: "text when there is no data", onhover(idx | null)
 * })
 */
export class MiniChart {
  constructor(el, opts) {
    this.el = el;
    this.o = { height: 110, x: "time", legend: true, ...opts };
    this.canvas = document.createElement("canvas");
    this.canvas.className = "mc-canvas";
    el.classList.add("minichart");
    el.append(this.canvas);
    this.ctx = this.canvas.getContext("2d");
    this.legend = null;
    if (this.o.legend) {
      this.legend = document.createElement("div");
      this.legend.className = "mc-legend";
      this.items = this.o.series.map((s) => {
        const item = document.createElement("span");
        item.className = "mc-item";
        const i = document.createElement("i");
        i.style.background = rgba(s.rgb, s.fill !== undefined && !s.bars ? Math.max(0.75, s.fill) : 1);
        if (s.dash) i.classList.add("dash");
        const v = document.createElement("b");
        item.append(i, `${s.label} `, v);
        this.legend.append(item);
        return v;
      });
      if (this.o.x === "time") {
        this.xItem = document.createElement("span");
        this.xItem.className = "mc-x";
        this.legend.prepend(this.xItem);
      }
      el.append(this.legend);
    }
    this.x = [];
    this.ys = [];
    this.marks = [];
    this.hover = null;
    this.W = 0;
    this.draws = 0;
    this.canvas.addEventListener("mousemove", (ev) => this._move(ev));
    this.canvas.addEventListener("mouseleave", () => {
      this.hover = null;
      this.draw();
      if (this.o.onhover) this.o.onhover(null);
    });
    new ResizeObserver(() => {
      if (Math.floor(this.el.clientWidth) !== this.W) this.draw();
    }).observe(el);
  }

  /** xs and one array per series (null = no value / a gap); marks: [{x, y, rgb, label}]. */
  setData(x, ys, marks = []) {
    this.x = x;
    this.ys = ys;
    this.marks = marks;
    if (this.hover !== null && this.hover >= x.length) this.hover = null;
    this.draw();
  }

  get lastIndex() {
    return this.x.length - 1;
  }

  // ----------------------------------------------------------- scales

  _layout() {
    const o = this.o;
    const dpr = window.devicePixelRatio || 1;
    const W = Math.max(80, Math.floor(this.el.clientWidth));
    const H = o.height;
    this.W = W;
    if (this.canvas.width !== Math.round(W * dpr) || this.canvas.height !== Math.round(H * dpr)) {
      this.canvas.width = Math.round(W * dpr);
      this.canvas.height = Math.round(H * dpr);
      this.canvas.style.width = `${W}px`;
      this.canvas.style.height = `${H}px`;
    }
    this.dpr = dpr;
    const left = o.yWidth || 38;
    const right = o.y2 ? o.y2Width || 38 : 8;
    this.box = { l: left, r: W - right, t: 6, b: H - 17 };
  }

  _yRange(axis) {
    const o = this.o;
    const spec = (axis === 2 ? o.y2 : o.y) || {};
    let hi = -Infinity;
    let lo = Infinity;
    const n = this.x.length;
    const stacked = o.series.some((s) => s.stack && (s.axis || 1) === axis);
    for (let i = 0; i < n; i++) {
      let acc = 0;
      for (let k = 0; k < o.series.length; k++) {
        const s = o.series[k];
        if ((s.axis || 1) !== axis) continue;
        const v = this.ys[k] ? this.ys[k][i] : null;
        if (v === null || v === undefined || !Number.isFinite(v)) continue;
        if (s.stack) acc += v;
        else {
          hi = Math.max(hi, v);
          lo = Math.min(lo, v);
        }
      }
      if (stacked) {
        hi = Math.max(hi, acc);
        lo = Math.min(lo, acc);
      }
    }
    for (const m of this.marks) {
      if ((m.axis || 1) === axis && Number.isFinite(m.y)) {
        hi = Math.max(hi, m.y);
        lo = Math.min(lo, m.y);
      }
    }
    if (!Number.isFinite(hi)) {
      hi = 1;
      lo = 0;
    }
    if (spec.range) return spec.range(lo, hi);
    return [0, niceMax(hi)];
  }

  _xRange() {
    const xs = this.x;
    if (this.o.x === "cat") return [-0.5, Math.max(0.5, xs.length - 0.5)];
    if (!xs.length) return [0, 1];
    let lo = xs[0];
    let hi = xs[xs.length - 1];
    if (this.o.xLog2) {
      lo = Math.log2(lo);
      hi = Math.log2(hi);
      const pad = Math.max(0.25, (hi - lo) * 0.08);
      return [lo - pad, hi + pad];
    }
    if (hi === lo) return [lo - 1, hi + 1];
    return [lo, hi];
  }

  _px(v) {
    const [a, b] = this.xr;
    const xv = this.o.xLog2 ? Math.log2(v) : this.o.x === "cat" ? v : v;
    return this.box.l + ((xv - a) / (b - a)) * (this.box.r - this.box.l);
  }

  _py(v, axis) {
    const [a, b] = axis === 2 ? this.y2r : this.yr;
    return this.box.b - ((v - a) / (b - a || 1)) * (this.box.b - this.box.t);
  }

  // ------------------------------------------------------------ draw

  draw() {
    if (!this.el.isConnected) return;
    this._layout();
    const { ctx, o, box, dpr } = this;
    this.draws++;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, this.W, o.height);
    ctx.font = FONT;
    this.xr = this._xRange();
    this.yr = this._yRange(1);
    if (o.y2) this.y2r = this._yRange(2);
    // y grid + labels
    ctx.textBaseline = "middle";
    ctx.fillStyle = AXIS;
    const yfmt = (o.y && o.y.fmt) || compact;
    for (const v of (o.y && o.y.ticks) || niceTicks(this.yr[0], this.yr[1], 3)) {
      const y = Math.round(this._py(v, 1)) + 0.5;
      ctx.strokeStyle = GRID;
      ctx.beginPath();
      ctx.moveTo(box.l, y);
      ctx.lineTo(box.r, y);
      ctx.stroke();
      ctx.textAlign = "right";
      ctx.fillText(yfmt(v), box.l - 5, y);
    }
    if (o.y2) {
      ctx.fillStyle = o.y2.rgb ? rgba(o.y2.rgb) : AXIS;
      for (const v of niceTicks(this.y2r[0], this.y2r[1], 3)) {
        ctx.textAlign = "left";
        ctx.fillText((o.y2.fmt || compact)(v), box.r + 5, this._py(v, 2));
      }
    }
    // x labels
    ctx.fillStyle = AXIS;
    ctx.textBaseline = "top";
    ctx.textAlign = "center";
    const xt = this.x.length ? this._xTicks() : [];
    for (const [v, label] of xt) {
      const x = this._px(v);
      if (x < box.l - 1 || x > box.r + 1) continue;
      ctx.fillText(label, Math.min(Math.max(x, box.l + 16), box.r - 16), box.b + 3);
    }
    if (!this.x.length) {
      if (o.empty) {
        ctx.textAlign = "center";
        ctx.textBaseline = "middle";
        ctx.fillText(o.empty, (box.l + box.r) / 2, (box.t + box.b) / 2);
      }
      this._legend(null);
      return;
    }
    this._series();
    for (const m of this.marks) this._mark(m);
    if (this.hover !== null) this._crosshair(this.hover);
    this._legend(this.hover);
  }

  _xTicks() {
    const o = this.o;
    if (o.x === "time") {
      const [a, b] = this.xr;
      const room = Math.max(1, Math.floor((this.box.r - this.box.l) / 72));
      const step = TIME_STEPS.find((s) => (b - a) / s <= room) || 3600;
      const out = [];
      for (let t = Math.ceil(a / step) * step; t <= b; t += step) out.push([t, hms(t)]);
      return out;
    }
    const fmt = o.xFmt || String;
    if (o.x === "cat") {
      const n = this.x.length;
      const room = Math.max(1, Math.floor((this.box.r - this.box.l) / 46));
      const every = Math.max(1, Math.ceil(n / room));
      const out = [];
      for (let i = 0; i < n; i += every) out.push([i, fmt(this.x[i], i)]);
      return out;
    }
    return (o.xTicks || this.x).map((v) => [v, fmt(v)]);
  }

  _series() {
    const { ctx, o } = this;
    const n = this.x.length;
    const xs = o.x === "cat" ? this.x.map((_, i) => i) : this.x;
    // stacked areas (bottom first)
    const base = new Array(n).fill(0);
    for (let k = 0; k < o.series.length; k++) {
      const s = o.series[k];
      const ys = this.ys[k] || [];
      const axis = s.axis || 1;
      if (s.bars) {
        const w = Math.max(1, ((this.box.r - this.box.l) / Math.max(1, n)) * 0.8);
        ctx.fillStyle = rgba(s.rgb, s.fill ?? 0.7);
        for (let i = 0; i < n; i++) {
          const v = ys[i];
          if (!v) continue;
          const x = this._px(xs[i]);
          const y = this._py(v, axis);
          ctx.fillRect(x - w / 2, y, w, this.box.b - y);
        }
        continue;
      }
      if (s.stack) {
        const top = new Array(n);
        for (let i = 0; i < n; i++) {
          const v = ys[i];
          top[i] = v === null || v === undefined || !Number.isFinite(v) ? null : base[i] + v;
        }
        this._area(xs, base, top, s, axis);
        for (let i = 0; i < n; i++) if (top[i] !== null) base[i] = top[i];
        continue;
      }
      if (s.fill) this._area(xs, null, ys, s, axis);
      else this._line(xs, ys, s, axis);
      if (s.points || n === 1) this._points(xs, ys, s, axis);
    }
  }

  _runs(ys) {
    const runs = [];
    let cur = null;
    for (let i = 0; i < ys.length; i++) {
      const v = ys[i];
      if (v === null || v === undefined || !Number.isFinite(v)) {
        cur = null;
        continue;
      }
      if (!cur) runs.push((cur = []));
      cur.push(i);
    }
    return runs;
  }

  _line(xs, ys, s, axis) {
    const { ctx } = this;
    ctx.strokeStyle = rgba(s.rgb);
    ctx.lineWidth = s.width || 1.25;
    ctx.setLineDash(s.dash || []);
    const runs = s.spanGaps ? [ys.map((v, i) => (v === null || v === undefined ? -1 : i)).filter((i) => i >= 0)] : this._runs(ys);
    for (const run of runs) {
      if (!run.length) continue;
      ctx.beginPath();
      run.forEach((i, j) => (j ? ctx.lineTo(this._px(xs[i]), this._py(ys[i], axis)) : ctx.moveTo(this._px(xs[i]), this._py(ys[i], axis))));
      ctx.stroke();
    }
    ctx.setLineDash([]);
  }

  _area(xs, base, top, s, axis) {
    const { ctx } = this;
    for (const run of this._runs(top)) {
      ctx.beginPath();
      run.forEach((i, j) => (j ? ctx.lineTo(this._px(xs[i]), this._py(top[i], axis)) : ctx.moveTo(this._px(xs[i]), this._py(top[i], axis))));
      for (let j = run.length - 1; j >= 0; j--) {
        const i = run[j];
        ctx.lineTo(this._px(xs[i]), this._py(base ? base[i] : this._yFloor(axis), axis));
      }
      ctx.closePath();
      ctx.fillStyle = rgba(s.rgb, s.fill ?? 0.55);
      ctx.fill();
      ctx.beginPath();
      run.forEach((i, j) => (j ? ctx.lineTo(this._px(xs[i]), this._py(top[i], axis)) : ctx.moveTo(this._px(xs[i]), this._py(top[i], axis))));
      ctx.strokeStyle = rgba(s.rgb);
      ctx.lineWidth = 1;
      ctx.stroke();
    }
  }

  _yFloor(axis) {
    return (axis === 2 ? this.y2r : this.yr)[0];
  }

  _points(xs, ys, s, axis) {
    const { ctx } = this;
    ctx.fillStyle = rgba(s.rgb);
    for (let i = 0; i < ys.length; i++) {
      const v = ys[i];
      if (v === null || v === undefined || !Number.isFinite(v)) continue;
      ctx.beginPath();
      ctx.arc(this._px(xs[i]), this._py(v, axis), 3, 0, Math.PI * 2);
      ctx.fill();
    }
  }

  _mark(m) {
    const { ctx } = this;
    const x = this._px(m.x);
    const y = this._py(m.y, m.axis || 1);
    ctx.strokeStyle = m.rgb ? rgba(m.rgb) : "#ffffff";
    ctx.lineWidth = 2;
    ctx.beginPath();
    ctx.arc(x, y, 6, 0, Math.PI * 2);
    ctx.stroke();
    if (m.label) {
      ctx.fillStyle = m.rgb ? rgba(m.rgb) : "#e6edf3";
      ctx.textAlign = x > (this.box.l + this.box.r) / 2 ? "right" : "left";
      ctx.textBaseline = "top";
      ctx.fillText(m.label, x + (ctx.textAlign === "left" ? 8 : -8), y + 5);
    }
  }

  _crosshair(i) {
    const { ctx, box } = this;
    const xv = this.o.x === "cat" ? i : this.x[i];
    const x = Math.round(this._px(xv)) + 0.5;
    ctx.strokeStyle = "rgba(230, 237, 243, 0.35)";
    ctx.lineWidth = 1;
    ctx.setLineDash([3, 3]);
    ctx.beginPath();
    ctx.moveTo(x, box.t);
    ctx.lineTo(x, box.b);
    ctx.stroke();
    ctx.setLineDash([]);
  }

  _legend(idx) {
    if (!this.legend) return;
    const i = idx !== null ? idx : this.o.legendIdx ? this.o.legendIdx(this.x) : this.lastIndex;
    const o = this.o;
    if (this.xItem) this.xItem.textContent = i >= 0 && this.x.length ? hms(this.x[i]) : "";
    for (let k = 0; k < o.series.length; k++) {
      const s = o.series[k];
      const v = i >= 0 && this.ys[k] ? this.ys[k][i] : null;
      const text = v === null || v === undefined ? "—" : (s.fmt || compact)(v);
      if (this.items[k].textContent !== text) this.items[k].textContent = text;
    }
  }

  _move(ev) {
    const n = this.x.length;
    if (!n) return;
    const rect = this.canvas.getBoundingClientRect();
    const px = ev.clientX - rect.left;
    let best = -1;
    let bestD = Infinity;
    for (let i = 0; i < n; i++) {
      const d = Math.abs(this._px(this.o.x === "cat" ? i : this.x[i]) - px);
      if (d < bestD) {
        bestD = d;
        best = i;
      }
    }
    if (best !== this.hover) {
      this.hover = best;
      this.draw();
      if (this.o.onhover) this.o.onhover(best);
    }
  }
}
