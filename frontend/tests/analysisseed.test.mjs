// Seeding the analysis series from GET /api/analysis/recent (analysisseed.js)
// and the operator tiles' values (operatortiles.js), on sections made by the
// server's own code (make_fixtures.py, scenario "analysis").
import assert from "node:assert/strict";
import { test } from "node:test";

import { AnalysisSeries, TokenSeries } from "../js/dashboard/state/analysis.js";
import { seedSeries, seedTokens } from "../js/dashboard/state/analysisseed.js";
import { NO_RATE, operatorValues, sinceLabel, usageText } from "../js/dashboard/state/operatortiles.js";
import { decodeFrame } from "../js/dashboard/wire/protocol.js";
import { loadScenario, toArrayBuffer } from "./fixtures.mjs";

const scen = loadScenario("analysis");
const frames = scen.frames.map((f) => decodeFrame(toArrayBuffer(f.bytes)));
const sections = frames.map((f) => f.header.analysis).filter(Boolean);
// as GET /api/analysis/recent keeps them: the counters and the token figures
const slim = sections.map((s, i) => ({
  ts: s.ts, misses: s.misses, miss_tokens: s.miss_tokens, hit_blocks: s.hit_blocks,
  regrets: s.regrets, evictions: s.evictions,
  tokens: { held: 10 + i, slots_reserved: 20 + i, tail_waste: 10, capacity: 188 }, tokens_ts: s.ts,
}));

const strip = (pts) => pts.map((p) => JSON.stringify(p));

test("history then the stream's sections give the points of one stream from the start", () => {
  assert.ok(sections.length >= 6, "the scenario has sections");
  const all = new AnalysisSeries();
  for (const s of sections) all.ingest(s);
  const k = Math.floor(sections.length / 2);
  const live = new AnalysisSeries();
  const early = sections.slice(k);
  for (const s of early) live.ingest(s);
  const v0 = live.version;
  // the server's history overlaps what the stream brought: the overlap is not taken twice
  const used = seedSeries(live, slim.slice(0, k + 2), early);
  assert.equal(used, k);
  assert.deepEqual(strip(live.points), strip(all.points));
  assert.equal(live.last, all.last, "the latest section stays the stream's full one");
  assert.ok(live.version > v0, "panels see a new version");
});

test("history alone (the stream has brought nothing yet) seeds the chart; the next section continues it", () => {
  const s = new AnalysisSeries();
  const used = seedSeries(s, slim.slice(0, 4), []);
  assert.equal(used, 4);
  assert.equal(s.points.length, 3);
  assert.ok(s.points[0].ts < sections[4].ts);
  const pt = s.ingest(sections[4]);
  assert.ok(pt && pt.ts === sections[4].ts, "a rate between the history's last and the stream's first");
});

test("token history goes before the stream's token points, in order, once", () => {
  const t = new TokenSeries();
  const k = 3;
  t.ingest(slim[k].tokens_ts, slim[k].tokens);
  const n = seedTokens(t, slim);
  assert.equal(n, k);
  assert.deepEqual(t.points.map((p) => p.ts), slim.slice(0, k + 1).map((s) => s.ts));
  assert.deepEqual(t.points.map((p) => p.held), [10, 11, 12, 13]);
  assert.equal(seedTokens(t, slim), 0, "nothing older left");
});

test("the operator tiles: windows, since start, running, waiting; a missing figure is a dash", () => {
  const pct = (x) => `${(x * 100).toFixed(1)}%`;
  const int = (n) => String(n);
  const v = operatorValues(
    { hit_rate_1m: 0.25, hit_rate_5m: 0.5, hit_rate_since: 0.75, waiting: 3 },
    { running_requests: 7, prefix_cache: { hits_tokens: 1, queries_tokens: 2 } },
    pct,
    int,
  );
  assert.deepEqual(
    Object.fromEntries(Object.entries(v).map(([k, x]) => [k, x.text])),
    { hit1m: "25.0%", hit5m: "50.0%", hit: "75.0%", requests: "7", waiting: "3" },
  );
  const none = operatorValues({ hit_rate_1m: null }, { prefix_cache: { hits_tokens: 1, queries_tokens: 4 } }, pct, int);
  assert.equal(none.hit1m.text, "—");
  assert.equal(none.hit.text, "25.0%", "an older server: since start from the header's counters");
  assert.equal(usageText(0.7342), "0.734");
  assert.equal(usageText(null), "—");
  // the since tile says what REST says: since reset once the cache was reset
  assert.equal(sinceLabel({ hit_rate_resets: 0 }), "since start");
  assert.equal(sinceLabel({ hit_rate_resets: 2 }), "since reset");
  assert.equal(sinceLabel({}), null);
});

test("the operator tiles on a mirror: running and waiting the engine's, or not known with the reason", () => {
  const pct = (x) => `${(x * 100).toFixed(1)}%`;
  const int = (n) => String(n);
  // a server that follows the engine's queues: its figures, zero included
  const known = operatorValues({ waiting: 9 }, { running_requests: 3, waiting_requests: 0, requests_reason: null }, pct, int, "older");
  assert.deepEqual([known.requests.text, known.waiting.text, known.requests.reason], ["3", "0", undefined]);
  // ... that does not know them: null with its reason, never a 0
  const told = operatorValues({}, { running_requests: null, waiting_requests: null, requests_reason: "the plugin is too old" }, pct, int, "older");
  assert.deepEqual([told.requests.text, told.requests.reason, told.waiting.reason], ["not known", "the plugin is too old", "the plugin is too old"]);
  // an older server on a mirror sends a default 0 and no reason: not known, the page's reason
  const old = operatorValues({ waiting: 0 }, { running_requests: 0 }, pct, int, "older");
  assert.deepEqual([old.requests.text, old.requests.reason, old.waiting.text, old.waiting.reason], ["not known", "older", "not known", "older"]);
  // not a mirror: the server's figures as they are
  const plain = operatorValues({ waiting: 0 }, { running_requests: 0 }, pct, int);
  assert.deepEqual([plain.requests.text, plain.waiting.text, plain.requests.reason], ["0", "0", undefined]);
  // a hit rate with no value says why (0 / 0, or under two samples)
  assert.equal(plain.hit1m.text, "—");
  assert.equal(plain.hit1m.reason, NO_RATE);
});
