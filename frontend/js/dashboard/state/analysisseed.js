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

/** Token-usage points from `history` older than the series' first, put first. */
export function seedTokens(tokens, history) {
  const first = tokens.points.length ? tokens.points[0].ts : Infinity;
  const pts = [];
  for (const s of history || []) {
    const k = s && s.tokens;
    if (!k || !Number.isFinite(s.tokens_ts) || s.tokens_ts >= first) continue;
    if (pts.length && pts[pts.length - 1].ts >= s.tokens_ts) continue;
    pts.push({ ts: s.tokens_ts, held: k.held, reserved: k.slots_reserved, waste: k.tail_waste, capacity: k.capacity });
  }
  if (!pts.length) return 0;
  tokens.points = pts.concat(tokens.points);
  if (!tokens.latest) tokens.latest = history[history.length - 1].tokens;
  tokens.version++;
  return pts.length;
}
