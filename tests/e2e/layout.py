"""What a page looks like to a reader, measured in the browser (the layout tests).

``overlaps(page)``: pairs of visible text pieces whose boxes intersect (leaf
text nodes' rects from Range.getClientRects, clipped by every scrolling or
hidden-overflow ancestor; hidden and zero-size pieces ignored; 1 px of
tolerance).  ``sideways(page)``: how far the document scrolls sideways.
"""

from __future__ import annotations

from typing import Any

OVERLAPS_JS = """
(tol) => {
  const visible = (el) => {
    for (let e = el; e && e.nodeType === 1; e = e.parentElement) {
      const cs = getComputedStyle(e);
      if (cs.display === "none" || cs.visibility !== "visible") return false;
      if (Number(cs.opacity) === 0) return false;
      if (["OPTION", "TEMPLATE", "SCRIPT", "STYLE"].includes(e.tagName)) return false;
      if (e.tagName === "DIALOG" && !e.open) return false;
      if (e.tagName === "DETAILS" && !e.open && e !== el) {
        // only the summary of a closed details shows
        if (!el.closest("summary")) return false;
      }
    }
    return true;
  };
  // the part of r an element's clipping ancestors let show
  const clip = (el, r) => {
    let { left, top, right, bottom } = r;
    for (let e = el; e && e !== document.documentElement; e = e.parentElement) {
      const cs = getComputedStyle(e);
      if (cs.overflowX !== "visible" || cs.overflowY !== "visible") {
        const c = e.getBoundingClientRect();
        if (cs.overflowX !== "visible") {
          left = Math.max(left, c.left);
          right = Math.min(right, c.right);
        }
        if (cs.overflowY !== "visible") {
          top = Math.max(top, c.top);
          bottom = Math.min(bottom, c.bottom);
        }
      }
    }
    return { left, top, right, bottom };
  };
  const pieces = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const range = document.createRange();
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (!n.textContent.trim()) continue;
    const el = n.parentElement;
    if (!el || !visible(el)) continue;
    range.selectNodeContents(n);
    for (const r of range.getClientRects()) {
      if (r.width < 1 || r.height < 1) continue;
      const c = clip(el, r);
      if (c.right - c.left < 1 || c.bottom - c.top < 1) continue;
      pieces.push({ ...c, el, text: n.textContent.trim().slice(0, 40) });
    }
  }
  const describe = (p) => {
    const e = p.el;
    const id = e.id ? "#" + e.id : "";
    const cls = typeof e.className === "string" && e.className.trim()
      ? "." + e.className.trim().split(/\\s+/).join(".") : "";
    const at = `@${Math.round(p.left)},${Math.round(p.top)}`;
    return `${e.tagName.toLowerCase()}${id}${cls} "${p.text}" ${at}`;
  };
  pieces.sort((a, b) => a.left - b.left);
  const found = [];
  for (let i = 0; i < pieces.length; i++) {
    const a = pieces[i];
    for (let j = i + 1; j < pieces.length && pieces[j].left < a.right - tol; j++) {
      const b = pieces[j];
      if (a.el === b.el && a.text === b.text) continue;
      const w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
      const h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
      if (w > tol && h > tol) found.push(`${describe(a)} | ${describe(b)}`);
    }
  }
  return { pieces: pieces.length, overlaps: found };
}
"""

SIDEWAYS_JS = """() => {
  const s = document.scrollingElement;
  return { scrollWidth: s.scrollWidth, clientWidth: s.clientWidth };
}"""


def overlaps(page: Any, tolerance: float = 1.0) -> dict[str, Any]:
    """{"pieces": n, "overlaps": ["a | b", ...]} for the page as it shows now."""
    return dict(page.evaluate(OVERLAPS_JS, tolerance))


def sideways(page: Any) -> dict[str, int]:
    return dict(page.evaluate(SIDEWAYS_JS))
