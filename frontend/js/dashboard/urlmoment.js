// @ts-check
// A moment in the page's URL: /?at=<Unix ms | Unix s | ISO 8601 | op seq>.
// Grafana's data links (docker/grafana/dashboards/blockpool-vllm.json) open
// the page at the clicked time (`${__value.time}`: Unix ms); the page then
// shows that moment in time travel, or says plainly that the recording does
// not hold it.  The URL is read once, when the page opens.

const MAX_TEXT = 64; // longer than any moment: refused unread
const MS_FROM = 1e12; // a number this large is Unix milliseconds (2001 onwards)
const S_FROM = 1e9; // ... this large Unix seconds; smaller: an op seq
const ISO = /^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?)?$/;

/**
 * The moment asked for by a URL's query string: null when there is no `at`;
 * `{ts}` (Unix seconds) for a time, `{seq}` for an op seq, `{problem}` for
 * anything else (said on the page, nothing fetched).
 * @param {string} search `location.search`
 * @returns {null | {text: string, ts?: number, seq?: number, problem?: string}}
 */
export function urlMoment(search) {
  const raw = new URLSearchParams(search).get("at");
  if (raw === null) return null;
  const text = raw.trim();
  const usage = "a Unix time in ms or s, an ISO 8601 time or an op seq";
  if (!text) return { text, problem: `the URL's at= is empty: give ${usage}` };
  if (text.length > MAX_TEXT) return { text: `${text.slice(0, 24)}…`, problem: `the URL's at= is too long: give ${usage}` };
  if (/^\d+(\.\d+)?$/.test(text)) {
    const v = Number(text);
    if (v >= MS_FROM) return { text, ts: v / 1000 };
    if (v >= S_FROM) return { text, ts: v };
    if (Number.isInteger(v)) return { text, seq: v };
    return { text, problem: `at=${text}: an op seq is a whole number (a time is Unix ms or s, or ISO 8601)` };
  }
  if (ISO.test(text)) {
    const ms = Date.parse(text);
    if (Number.isFinite(ms)) return { text, ts: ms / 1000 };
  }
  return { text, problem: `at=${text} is not a moment: give ${usage}` };
}

/** @param {number} ts Unix seconds */
export const isoMs = (ts) => new Date(Math.round(ts * 1000)).toISOString();

/**
 * Why the recording (GET /api/history) cannot show `ts`, or null when it can:
 * before its first op (dropped, or before the service ran) or after now.
 * A time after the latest op and not in the future shows the latest op: the
 * pool has not changed since.
 * @param {number} ts Unix seconds
 * @param {{enabled?: boolean, first_ts: number, last_ts: number, first_seq: number, last_seq: number} | null} info
 * @param {number} now Unix seconds (the page's clock)
 * @param {number} [skew] seconds the page's clock may be behind the server's
 */
export function outsideRecording(ts, info, now, skew = 5) {
  if (!info || !info.enabled) return `${isoMs(ts)}: this server keeps no recording (time travel is off)`;
  const held = `the recording holds ${isoMs(info.first_ts)} – ${isoMs(info.last_ts)}`;
  if (ts < info.first_ts) return `${isoMs(ts)} is outside the recording (before it): ${held}`;
  if (ts > Math.max(now, info.last_ts) + skew) return `${isoMs(ts)} is outside the recording (in the future): ${held}`;
  return null;
}

/**
 * Open the URL's moment in time travel once the page holds its pool (the
 * first snapshot: a recorded moment is drawn only on a map of its size).
 * @param {import("./panels/analysis/timetravel.js").TimeTravel} history
 * @param {import("./state/model.js").PoolModel} model
 * @param {(path: string) => Promise<any>} read GET a path (quiet)
 * @param {string} [search]
 */
export function openUrlMoment(history, model, read, search = location.search) {
  const want = urlMoment(search);
  if (want === null) return;
  const box = history.jump;
  let done = false;
  model.on("snapshot", async () => {
    if (done) return; // once: a reconnect does not jump back
    done = true;
    document.body.dataset.urlMoment = "pending";
    const settle = (/** @type {string} */ state, /** @type {string | null} */ problem) => {
      document.body.dataset.urlMoment = state;
      if (problem) history._jumpBad(problem);
    };
    // after a jump: shown, or refused with what the jump said (its error, or
    // the moment line's reason when the moment could not be drawn)
    const jumped = () => {
      if (history.active) settle("shown", null);
      else settle("refused", history.jumpError || history.atEl.textContent || "not shown");
    };
    if (want.problem) return settle("refused", want.problem);
    if (want.seq !== undefined) {
      box.value = String(want.seq);
      await history.jumpTo(box.value);
      return jumped();
    }
    const ts = /** @type {number} */ (want.ts);
    box.value = isoMs(ts);
    let info = null;
    try {
      info = await read("/api/history");
    } catch (err) {
      return settle("refused", `${isoMs(ts)}: GET /api/history: ${err.message}`);
    }
    const problem = outsideRecording(ts, info, Date.now() / 1000);
    if (problem) return settle("refused", problem);
    document.body.dataset.urlTs = String(ts);
    await history.jumpTo(String(ts));
    jumped();
  });
}
