// The moment in the page's URL (/?at=...): Grafana's Unix ms, Unix s, ISO
// 8601 and op seqs read as such; anything else refused with the reason; a
// time the recording does not hold said to be outside it.

import assert from "node:assert/strict";
import { test } from "node:test";

import { isoMs, outsideRecording, urlMoment } from "../js/dashboard/urlmoment.js";

test("no at= in the URL: nothing to open", () => {
  assert.equal(urlMoment(""), null);
  assert.equal(urlMoment("?token=x"), null);
});

test("Unix ms (Grafana's ${__value.time}), Unix s, ISO 8601 and op seqs", () => {
  assert.deepEqual(urlMoment("?at=1764775323456"), { text: "1764775323456", ts: 1764775323.456 });
  assert.deepEqual(urlMoment("?at=1764775323.5"), { text: "1764775323.5", ts: 1764775323.5 });
  assert.deepEqual(urlMoment("?at=2025-12-03T15:22:03.250Z"), { text: "2025-12-03T15:22:03.250Z", ts: 1764775323.25 });
  assert.deepEqual(urlMoment("?at=2025-12-03T16:22:03%2B01:00"), { text: "2025-12-03T16:22:03+01:00", ts: 1764775323 });
  assert.deepEqual(urlMoment("?at=512"), { text: "512", seq: 512 });
  assert.equal(isoMs(1764775323.25), "2025-12-03T15:22:03.250Z");
});

test("anything else is refused with the reason, nothing fetched", () => {
  for (const bad of ["?at=", "?at=abc", "?at=12.5", "?at=-3", "?at=2025-13-45T99:00:00Z", `?at=${"9".repeat(80)}`]) {
    const m = urlMoment(bad);
    assert.ok(m && m.problem && m.ts === undefined && m.seq === undefined, bad);
  }
  assert.match(urlMoment("?at=12.5")?.problem || "", /whole number/);
  assert.match(urlMoment(`?at=${"9".repeat(80)}`)?.problem || "", /too long/);
});

test("a time before the recording, in the future, or with no recording is outside it", () => {
  const info = { enabled: true, first_ts: 1000, last_ts: 2000, first_seq: 10, last_seq: 90 };
  assert.equal(outsideRecording(1000, info, 2001), null);
  assert.equal(outsideRecording(1500, info, 2001), null);
  assert.equal(outsideRecording(2100, info, 2200), null); // after the latest op: the pool since
  assert.match(outsideRecording(999, info, 2001) || "", /outside the recording \(before it\): the recording holds 1970-01-01T00:16:40.000Z/);
  assert.match(outsideRecording(2100, info, 2001) || "", /in the future/);
  assert.match(outsideRecording(1500, { ...info, enabled: false }, 2001) || "", /no recording/);
  assert.match(outsideRecording(1500, null, 2001) || "", /no recording/);
});
