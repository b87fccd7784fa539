// @ts-check
// The block map's mouse: hover (onhover), a click without a drag selects
// (onselect), a drag pans when zoomed in, the wheel zooms at the pointer and
// a double click zooms back out.

/** @param {import("./blockmap.js").BlockMap} map */
export function wireInput(map) {
  const el = map.overlay;
  /** @type {{x: number, y: number, panX: number, panY: number, moved: boolean} | null} a press, while held */
  let drag = null;
  el.addEventListener("mousemove", (ev) => {
    if (drag) {
      const dx = ev.offsetX - drag.x;
      const dy = ev.offsetY - drag.y;
      if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
      if (drag.moved && map.zoom > 1) {
        const s = map.effScale;
        map.panTo(drag.panX - (dx * map.dpr) / s, drag.panY - (dy * map.dpr) / s);
      }
      return;
    }
    const id = map.hitTest(ev.offsetX, ev.offsetY);
    if (id !== map.hl.hover) {
      map.setHighlight("hover", id);
      if (map.onhover) map.onhover(id);
    }
  });
  el.addEventListener("mouseleave", () => {
    drag = null;
    map.setHighlight("hover", -1);
    if (map.onhover) map.onhover(-1);
  });
  el.addEventListener("mousedown", (ev) => {
    drag = { x: ev.offsetX, y: ev.offsetY, panX: map.panX, panY: map.panY, moved: false };
  });
  el.addEventListener("mouseup", (ev) => {
    const d = drag;
    drag = null;
    if (d && !d.moved) {
      const id = map.hitTest(ev.offsetX, ev.offsetY);
      if (map.onselect) map.onselect(id);
    }
  });
  el.addEventListener(
    "wheel",
    (ev) => {
      ev.preventDefault();
      const z = map.zoom * (ev.deltaY < 0 ? 1.25 : 0.8);
      map.zoomAt(ev.offsetX * map.dpr, ev.offsetY * map.dpr, z);
    },
    { passive: false },
  );
  el.addEventListener("dblclick", () => map.zoomAt(0, 0, 1));
}
