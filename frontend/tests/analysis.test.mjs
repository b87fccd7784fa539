// The analysis panels' client-side state, on frames and REST answers made
// by the server's own code (make_fixtures.py, scenario "analysis": inline
// analysis and shadow pools, every frame with its `analysis` section).
import assert from "node:assert/strict";
import { test } from "node:test";

import { AnalysisSeries, TokenSeries, analysisHealth, missColumns, trimHistogram } from "../js/dashboard/state/analysis.js";
import { REASONS } from "../js/dashboard/state/missreasons.js";
import { buildCurve, whatIf } from "../js/dashboard/state/whatif.js";
import { HistorySource, diffRows, momentProblem, parseMoment, seqTime } from "../js/dashboard/state/history.js";
import { PoolModel } from "../js/dashboard/state/model.js";
import { decodeFrame } from "../js/dashboard/wire/protocol.js";
import { blockCells, cellCounts, describeCell } from "../js/dashboard/render/reqbars.js";
import { loadJson, loadScenario, toArrayBuffer } from "./fixtures.mjs";

const scen = loadScenario("analysis");
const rest = loadJson("analysis", "rest.json");
const frames = scen.frames.map((f) => ({ ...f, frame: decodeFrame(toArrayBuffer(f.bytes)) }));
const sections = frames.map((f) => f.frame.header.analysis).filter(Boolean);
const BS = 4;

test("every frame of the scenario carries an analysis section and token figures", () => {
  assert.equal(sections.length, frames.length - 1, "all but the config frame");
  for (const f of frames.slice(1)) {
    const t = f.frame.header.tokens;
    assert.ok(t, f.note);
    assert.equal(t.held, t.slots_reserved - t.tail_waste, f.note);
  }
});

test("rates: consecutive sections differenced over their ts", () => {
  const s = new AnalysisSeries();
  const pts = [];
  for (const sec of sections) {
    const p = s.ingest(sec);
    if (p) pts.push(p);
  }
  assert.equal(pts.length, sections.length - 1);
  assert.equal(s.resets, 0);
  for (let i = 1; i < sections.length; i++) {
    const a = sections[i - 1];
    const b = sections[i];
    const p = pts[i - 1];
    const dt = b.ts - a.ts;
    assert.equal(p.ts, b.ts);
    for (const r of REASONS) {
      assert.ok(Math.abs(p.misses[r] - (b.misses[r] - a.misses[r]) / dt) < 1e-9, `${r} blocks/s`);
      assert.ok(Math.abs(p.missTokens[r] - (b.miss_tokens[r] - a.miss_tokens[r]) / dt) < 1e-9, `${r} tokens/s`);
    }
    assert.ok(Math.abs(p.regrets - (b.regrets - a.regrets) / dt) < 1e-9);
    assert.ok(Math.abs(p.evictions - (b.evictions - a.evictions) / dt) < 1e-9);
  }
  // the admission of A3 after everything was evicted: evicted misses and regrets
  const a3 = frames.findIndex((f) => f.note.startsWith("admit A3"));
  const p = pts[a3 - 2]; // frames: config, snapshot (first section), then one point per delta
  assert.ok(p.misses.evicted > 0 && p.regrets > 0, "evicted misses and regrets appear at A3");
  // the stacked chart's columns
  const { x, ys } = missColumns(pts);
  assert.equal(x.length, pts.length);
  assert.deepEqual(
    ys.map((col) => col.at(-1)),
    REASONS.map((r) => pts.at(-1).misses[r]),
  );
});

test("totals of the last section equal GET /api/misses", () => {
  const s = new AnalysisSeries();
  for (const sec of sections) s.ingest(sec);
  const tot = s.totals();
  for (const r of REASONS) {
    assert.equal(tot.reasons[r].blocks, rest.misses.reasons[r].blocks, r);
    assert.equal(tot.reasons[r].tokens, rest.misses.reasons[r].tokens, r);
    assert.ok(Math.abs(tot.reasons[r].share - rest.misses.reasons[r].share) < 1e-12, r);
  }
  assert.equal(tot.missed, rest.misses.missed.blocks);
  assert.equal(tot.hit, rest.misses.hit.blocks);
  for (const r of ["last_token", "block_size_floor", "cold", "evicted", "extra_keys"]) {
    assert.ok(tot.reasons[r].blocks > 0, `the scenario has ${r} misses`);
  }
});

test("a repeated report is ignored; counters going down start over with a gap", () => {
  const s = new AnalysisSeries();
  const [a, b] = sections.slice(-2);
  s.ingest(sections[1]);
  s.ingest(b);
  const n = s.points.length;
  assert.equal(s.ingest({ ...b }), null, "same ts: the worker has not reported since");
  assert.equal(s.points.length, n);
  const restartedAt = { ...sections[1], ts: b.ts + 1 };
  assert.equal(s.ingest(restartedAt), null);
  assert.equal(s.resets, 1);
  assert.equal(s.points.at(-1).gap, true);
  assert.equal(s.points.at(-1).misses.cold, null, "a gap in the chart, not a negative rate");
  const later = { ...a, ts: b.ts + 2 };
  const p = s.ingest(later);
  assert.ok(p && p.misses.cold >= 0, "rates again from the new base");
});

test("token usage series from every frame", () => {
  const m = new PoolModel();
  const t = new TokenSeries();
  m.on("snapshot", (fr) => t.ingest(1, fr.header.tokens));
  m.on("delta", (fr) => t.ingest(fr.header.ts, fr.header.tokens));
  for (const f of frames) m.apply(f.frame);
  assert.equal(t.points.length, frames.length - 1);
  const last = frames.at(-1).frame.header.tokens;
  assert.deepEqual(t.latest, last);
  assert.equal(t.points.at(-1).waste, last.tail_waste);
  assert.ok(t.points.some((p) => p.waste > 0), "partial tail blocks waste slots");
  t.ingest(t.points.at(-1).ts, { ...last, held: 1 });
  assert.equal(t.points.length, frames.length - 1, "the same ts replaces, not appends");
});

test("miss-ratio curve: the REST curve and the stream's shadow rows agree", () => {
  const c = buildCurve(rest.shadows);
  const want = rest.shadows.curve;
  assert.deepEqual(
    c.policies.map((p) => p.policy).sort(),
    Object.keys(want).sort(),
  );
  assert.equal(c.policies[0].policy, "append_all", "vLLM's own order first");
  for (const p of c.policies) {
    assert.deepEqual(
      p.points.map((q) => [q.factor, q.capacity, q.hit_rate]),
      want[p.policy].map((q) => [q.factor, q.capacity, q.hit_rate]),
    );
  }
  assert.deepEqual(c.factors, [0.5, 1, 2]);
  assert.equal(c.real.hit_rate, rest.shadows.real.span.hit_rate);
  const fromStream = buildCurve(sections.at(-1));
  assert.deepEqual(
    fromStream.policies.map((p) => [p.policy, p.points.map((q) => [q.factor, q.capacity, q.hit_rate])]),
    c.policies.map((p) => [p.policy, p.points.map((q) => [q.factor, q.capacity, q.hit_rate])]),
  );
});

test("what-if in words: against vLLM's order at 1x", () => {
  const c = buildCurve(rest.shadows);
  const lines = whatIf(c);
  const base = c.policies[0].points.find((p) => p.factor === 1).hit_rate;
  assert.equal(lines[0].kind, "base");
  assert.match(lines[0].text, new RegExp(`${(base * 100).toFixed(1)}%`));
  const cap = lines.filter((l) => l.kind === "capacity");
  assert.deepEqual(
    cap.map((l) => l.factor),
    [0.5, 2],
  );
  assert.match(cap[1].text, /^2× the blocks \(94\)/);
  const pol = lines.filter((l) => l.kind === "policy").map((l) => l.policy);
  assert.deepEqual(pol.sort(), ["s3fifo", "uncached_first"]);
  // a made-up curve: the sign and the points
  const made = whatIf({ policies: [{ policy: "append_all", points: [{ factor: 1, capacity: 10, hit_rate: 0.5 }, { factor: 2, capacity: 20, hit_rate: 0.6 }] }], factors: [1, 2], real: null });
  assert.match(made[1].text, /60\.0%, \+10\.0 pt/);
});

test("what-if on a mirror: against the engine's own free order at 1x", () => {
  const curve = {
    policies: [
      { policy: "uncached_first", points: [{ factor: 1, capacity: 63, hit_rate: 0.2 }, { factor: 4, capacity: 252, hit_rate: 0.35 }] },
      { policy: "s3fifo", points: [{ factor: 1, capacity: 63, hit_rate: 0.25 }] },
    ],
    factors: [1, 4],
    real: { hit_rate: 0.2 },
  };
  const lines = whatIf(curve, "uncached_first");
  assert.deepEqual(
    lines.map((l) => [l.kind, l.policy, l.factor]),
    [["base", "uncached_first", 1], ["capacity", "uncached_first", 4], ["policy", "s3fifo", 1]],
  );
  assert.match(lines[1].text, /^4× the blocks \(252\): 35\.0%, \+15\.0 pt\.$/);
  // under vLLM 0.16's order the same curve has no baseline of its own: the real pool's
  assert.equal(whatIf(curve)[0].policy, "real");
});

test("request bars: one per block, the reasons of GET /api/requests/{id}", () => {
  const req = rest.request;
  const cells = blockCells(req, BS);
  assert.equal(cells.length, req.blocks.length);
  const prompt = Math.ceil(req.num_prompt_tokens / BS);
  req.blocks.forEach((b, i) => {
    const c = cells[i];
    if (i >= prompt) assert.equal(c.kind, "decode");
    else if (b.hit) assert.equal(c.kind, "hit");
    else assert.equal(c.reason, b.reason);
    assert.equal(c.blockId, b.block_ids[0]);
  });
  assert.ok(cells.some((c) => c.reason === "evicted"));
  const ev = cells.find((c) => c.reason === "evicted");
  assert.match(describeCell(ev), /evicted .* ago \(reuse\) from #\d+/);
  // a finished request, from GET /api/misses/requests/{id}
  const fin = blockCells(rest.request_misses, BS);
  assert.deepEqual(
    fin.map((c) => (c.kind === "miss" ? c.reason : c.kind)),
    rest.request_misses.blocks.map((b) => (b.hit ? "hit" : b.reason)),
  );
  assert.match(describeCell(fin[2]), /shares 2 tokens of this block with A/);
  assert.match(describeCell(fin.at(-1)), /partial tail block \(1 tokens/);
  assert.deepEqual(cellCounts(fin), [
    ["hit", 2],
    ["block_size_floor", 2],
    ["cold", 2],
  ]);
  // a reason not reported yet
  const pending = blockCells({ num_prompt_tokens: 8, blocks: [{ hit: true }, { hit: false, reason: null }, { hit: false }] }, BS);
  assert.deepEqual(
    pending.map((c) => c.kind),
    ["hit", "pending", "decode"],
  );
});

test("a recorded moment as a map source; the diff as lists", () => {
  const st = rest.history_state;
  const src = new HistorySource(st);
  assert.equal(src.n, 48);
  assert.equal(src.seq, st.at.seq);
  const names = ["null", "in_use", "cached", "empty"];
  assert.deepEqual(
    Array.from(src.state, (s) => names[s]),
    st.blocks.state,
  );
  assert.deepEqual(Array.from(src.refCnt), st.blocks.ref_cnt);
  let full = null;
  src.drainDirty((f, ids, n) => (full = [f, n]));
  assert.deepEqual(full, [true, 0]);
  src.drainDirty((f) => (full = f));
  assert.equal(full, false, "drawn once");
  const d = diffRows(rest.history_diff);
  assert.equal(d.evicted.length, rest.history_diff.evicted.length);
  assert.equal(d.evictedTotal, rest.history_diff.evicted_total);
  assert.deepEqual(d.evicted[0], [rest.history_diff.evicted[0].hash64, rest.history_diff.evicted[0].block_id]);
  assert.deepEqual(d.started, rest.history_diff.requests.started);
  assert.deepEqual(d.ended, rest.history_diff.requests.ended);
});

test("seq -> time between keyframes; what the jump box accepts", () => {
  const info = { first_seq: 100, first_ts: 1000, last_seq: 300, last_ts: 1100, keyframes: [{ seq: 200, ts: 1080 }] };
  assert.equal(seqTime(info, 100), 1000);
  assert.equal(seqTime(info, 150), 1040);
  assert.equal(seqTime(info, 250), 1090);
  assert.equal(seqTime(info, 400), 1100);
  assert.equal(parseMoment("1200"), "1200");
  const now = new Date(2026, 10, 29, 15, 0, 0);
  assert.equal(Number(parseMoment("14:02", now)), new Date(2026, 10, 29, 14, 2, 0).getTime() / 1000);
  assert.equal(Number(parseMoment("14:02:05", now)), new Date(2026, 10, 29, 14, 2, 5).getTime() / 1000);
  assert.equal(parseMoment("2026-11-29T14:02:00Z"), "2026-11-29T14:02:00Z");
  assert.equal(parseMoment("  "), null);
  // a clock time out of range is refused here, never rolled over to another day
  assert.equal(parseMoment("99:99:99", now), null);
  assert.match(momentProblem("99:99:99"), /not a time of day/);
  assert.match(momentProblem("24:00"), /hours 0–23/);
  assert.equal(momentProblem("23:59:59"), null);
  assert.equal(momentProblem("1200"), null);
  assert.equal(momentProblem("abc"), null); // the server says why (422), the page keeps it
});

test("analysis health: lag, restarts, errors, a report that stopped moving", () => {
  const sec = sections.at(-1);
  assert.equal(analysisHealth(null).level, "off");
  // an idle server runs the analysis before its first report: on, waiting
  assert.deepEqual([analysisHealth(null, { enabled: true }).level, analysisHealth(null, { enabled: true }).text], ["ok", "on, waiting for operations"]);
  assert.deepEqual(
    [analysisHealth(sec).level, analysisHealth(sec).text],
    ["ok", "inline"],
  );
  const w = (worker, extra = {}) => analysisHealth({ ...sec, worker, ...extra }, { resyncs0: 0, ...extra.ctx });
  assert.equal(w({ lag_ops: 12, resyncs: 0, error: null }).level, "ok");
  assert.equal(w({ lag_ops: 12, resyncs: 0, error: null }).text, "lag 12 ops");
  assert.equal(w({ lag_ops: 90000, resyncs: 0, error: null }).level, "warn");
  const restarted = w({ lag_ops: 0, resyncs: 2, error: null });
  assert.equal(restarted.level, "warn");
  assert.match(restarted.text, /2 restarts/);
  assert.equal(analysisHealth({ ...sec, worker: { lag_ops: 0, resyncs: 2, error: null } }, { resyncs0: 2 }).level, "ok", "restarts before the page opened");
  const failed = w({ lag_ops: 0, resyncs: 0, error: "boom" });
  assert.equal(failed.level, "err");
  assert.match(failed.title, /boom/);
  assert.equal(analysisHealth({ ...sec, shadow_error: "dead" }).level, "err");
  const stale = analysisHealth(sec, { sinceMoveS: 12 });
  assert.equal(stale.level, "warn");
  assert.match(stale.text, /stale 12s/);
});

test("histogram trimming keeps one empty bucket of context", () => {
  const hg = rest.regret.gap_seconds;
  const t = trimHistogram(hg);
  assert.equal(t.counts.reduce((a, b) => a + b, 0), hg.count);
  assert.equal(t.counts[0], 0);
  assert.equal(t.counts.at(-1), 0);
  assert.deepEqual(trimHistogram(null).counts, []);
});
