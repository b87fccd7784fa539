// @ts-check
// Block colours: one place for the map, its legend and the tests.
// null | in use (shade by ref count 1, 2, 3, 4+) | cached (evictable) |
// cached and about to be evicted | empty.

/** @typedef {readonly number[]} RGB one colour: [r, g, b], each 0..255 */

/**
 * @type {{background: RGB, null: RGB, empty: RGB, cached: RGB, risk: RGB, in_use: RGB[]}}
 */
export const COLORS = {
  background: [13, 17, 23],
  null: [139, 148, 158],
  empty: [33, 40, 52],
  cached: [46, 160, 67],
  risk: [240, 136, 62],
  in_use: [
    [31, 111, 235], // ref 1
    [88, 166, 255], // ref 2
    [121, 192, 255], // ref 3
    [202, 232, 255], // ref 4+
  ],
};

/** @param {RGB} rgb */
export const rgbCss = ([r, g, b]) => `rgb(${r}, ${g}, ${b})`;

/** @param {RGB} rgb @param {number} [a] its alpha */
export const rgba = ([r, g, b], a = 1) => `rgba(${r}, ${g}, ${b}, ${a})`;

/** ImageData's little-endian RGBA as one u32. */
/** @param {RGB} rgb */
export const abgr = ([r, g, b]) => ((255 << 24) | (b << 16) | (g << 8) | r) >>> 0;

export const PACKED = {
  background: abgr(COLORS.background),
  null: abgr(COLORS.null),
  empty: abgr(COLORS.empty),
  cached: abgr(COLORS.cached),
  risk: abgr(COLORS.risk),
  in_use: COLORS.in_use.map(abgr),
};

/**
 * The packed colour of one block.
 * @param {number} state
 * @param {number} refCnt
 * @param {number} risk non-zero: about to be evicted
 */
export function packedColor(state, refCnt, risk) {
  switch (state) {
    case 1:
      return PACKED.in_use[refCnt >= 4 ? 3 : refCnt <= 1 ? 0 : refCnt - 1];
    case 2:
      return risk ? PACKED.risk : PACKED.cached;
    case 3:
      return PACKED.empty;
    default:
      return PACKED.null;
  }
}

/**
 * The [r, g, b] colours a block in `state` may be drawn with (tests).
 * @param {number} state
 */
export function colorsForState(state) {
  if (state === 1) return COLORS.in_use;
  if (state === 2) return [COLORS.cached, COLORS.risk];
  if (state === 3) return [COLORS.empty];
  return [COLORS.null];
}
