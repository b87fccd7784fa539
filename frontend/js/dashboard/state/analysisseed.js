// @ts-check
// The analysis series seeded from REST as the page opens, without DOM (node
// tests import it): GET /api/analysis/recent's sections (oldest first) go
// before the sections the stream brought while the answer was on its way,
// so the charts start with the server's last minutes, not an empty axis.

import { AnalysisSeries } from "./analysis.js";

/**
 * Rebuild `series` (an AnalysisSeries) from `history` -- the REST sections
 * older than the first of `early` -- then `early`, the stream's sections so
 * far, in order.  Returns how many history sections were taken.
 * @param {import("./analysis.js").AnalysisSeries} series
 * @param {(import("./analysis.js").AnalysisSection | null)[] | null | undefined} history
 * @param {import("./analysis.js").AnalysisSection[]} early
 */
export function seedSeries(series, history, early) {
  const firstLive = early.length ? early[0].ts : Infinity;
  const fresh = new AnalysisSeries({ keep: series.keep });
  let used = 0;
  for (const s of history || []) {
    if (!s || !Number.isFinite(s.ts) || s.ts >= firstLive || !s.misses) continue;
    fresh.ingest(s);
    used++;
  }
  for (const s of early) fresh.ingest(s);
  series.points = fresh.points;
  series.last = fresh.last;
  series.sections = fresh.sections;
  series.resets += fresh.resets;
  series.version += fresh.version + 1; // every panel redraws
  return used;
}

/**
 * A section of GET /api/analysis/recent with the frame's `tokens` beside it.
 * @typedef {{tokens?: import("./analysis.js").TokenUsage | null, tokens_ts?: number}} TokensEntry
 */

/**
 * Token-usage points from `history` older than the series' first, put first.
 * @param {import("./analysis.js").TokenSeries} tokens
 * @param {(TokensEntry | null)[]} history
 */
export function seedTokens(tokens, history) {
  const first = tokens.points.length ? tokens.points[0].ts : Infinity;
  /** @type {import("./analysis.js").TokenPoint[]} */
  const pts = [];
  for (const s of history || []) {
    const k = s && s.tokens;
    const ts = s ? s.tokens_ts : undefined;
    if (!k || ts === undefined || !Number.isFinite(ts) || ts >= first) continue;
    if (pts.length && pts[pts.length - 1].ts >= ts) continue;
    pts.push({ ts, held: k.held, reserved: k.slots_reserved, waste: k.tail_waste, capacity: k.capacity });
  }
  if (!pts.length) return 0;
  tokens.points = pts.concat(tokens.points);
  const newest = history[history.length - 1];
  if (!tokens.latest && newest) tokens.latest = newest.tokens || null;
  tokens.version++;
  return pts.length;
}
