// @ts-check
// The block map's overlay canvas: the focus (a request's or a hash's blocks
// outlined, the rest dimmed), hover and selection outlines, and the cell
// grid when zoomed in far enough.  Redrawn only when a highlight, the zoom
// or the pan changed (BlockMap.needOverlay).

const HIGHLIGHT = {
  request: "rgba(227, 179, 65, 0.95)",
  hash: "rgba(219, 97, 162, 0.95)",
  selected: "#ffffff",
  hover: "rgba(255, 255, 255, 0.7)",
};

/** @param {import("./blockmap.js").BlockMap} map */
export function drawOverlay(map) {
  const { octx, W, H, hl } = map;
  octx.clearRect(0, 0, W, H);
  grid(map);
  /** @type {[number[], string][]} */
  const groups = [
    [hl.request, HIGHLIGHT.request],
    [hl.hash, HIGHLIGHT.hash],
  ];
  const focus = hl.request.length || hl.hash.length;
  if (focus) {
    octx.fillStyle = "rgba(0, 0, 0, 0.55)";
    octx.fillRect(0, 0, W, H);
    for (const [ids] of groups) {
      for (const id of ids) {
        const r = map.cellRect(id);
        octx.clearRect(r.x - 1, r.y - 1, r.w + 2, r.h + 2);
      }
    }
  }
  for (const [ids, color] of groups) outline(map, ids, color, 1.5);
  if (hl.hover >= 0 && hl.hover !== hl.selected) outline(map, [hl.hover], HIGHLIGHT.hover, 1);
  if (hl.selected >= 0) outline(map, [hl.selected], HIGHLIGHT.selected, 2);
}

/** Cell borders when zoomed in far enough to see them (visible cells only). */
/** @param {import("./blockmap.js").BlockMap} map */
function grid(map) {
  const s = map.effScale;
  const cell = map.k * s;
  if (map.gap || cell < 6) return;
  const { octx, W, H, k } = map;
  const c0 = Math.floor(map.panX / k);
  const r0 = Math.floor(map.panY / k);
  const c1 = Math.min(map.cols, Math.ceil((map.panX + W / s) / k));
  const r1 = Math.min(map.rows, Math.ceil((map.panY + H / s) / k));
  octx.fillStyle = "rgba(13, 17, 23, 0.9)";
  const x1 = (c1 * k - map.panX) * s;
  const y1 = (r1 * k - map.panY) * s;
  for (let c = c0; c <= c1; c++) octx.fillRect((c * k - map.panX) * s - 0.5, 0, 1, y1);
  for (let r = r0; r <= r1; r++) octx.fillRect(0, (r * k - map.panY) * s - 0.5, x1, 1);
}

/**
 * @param {import("./blockmap.js").BlockMap} map
 * @param {number[]} ids
 * @param {string} color
 * @param {number} lw line width, CSS px
 */
function outline(map, ids, color, lw) {
  const { octx } = map;
  octx.strokeStyle = color;
  octx.fillStyle = color;
  octx.lineWidth = lw * map.dpr;
  for (const id of ids) {
    if (id < 0 || id >= map.n) continue;
    const r = map.cellRect(id);
    if (r.x + r.w < 0 || r.y + r.h < 0 || r.x > map.W || r.y > map.H) continue;
    if (r.w >= 5) octx.strokeRect(r.x - 1, r.y - 1, r.w + 2, r.h + 2);
    else octx.strokeRect(r.x - 2, r.y - 2, r.w + 4, r.h + 4);
  }
}
