// @ts-check
// The lag from the engine's step to this page, on a mirror service
// (`blockpool serve --mirror`), without DOM (node tests import it).
//
// Every stream frame there carries `mirror: {engine_ts, batch}`
// (docs/protocol.md): the newest engine batch applied before the frame and
// the engine's step time.  A delta that brings a batch this page has not seen
// gives one sample: its receive time minus that engine_ts.  A frame repeating
// the batch gives none (with an idle engine its age grows: idleness, not lag),
// and a snapshot only says which batch the samples start after (it may carry
// one applied long ago).  engine_ts is the engine machine's clock and the
// receive time this browser's: the figure assumes they are one clock (a skew
// between the two machines adds to it or takes from it).

/** @typedef {{engine_ts: number, batch: number}} MirrorHeader */

export class MirrorLag {
  /** @param {{keep?: number}} [opts] keep: the samples the p50 is over */
  constructor({ keep = 100 } = {}) {
    this.keep = keep;
    /** @type {number[]} lag samples in ms, oldest first (at most `keep`) */
    this.samples = [];
    /** @type {number | null} the batch of the last frame taken */
    this.batch = null;
    /** @type {number | null} the latest sample, ms */
    this.lastMs = null;
    this.taken = 0; // samples ever taken
  }

  /**
   * One applied frame's `mirror` header (absent on a service that is no
   * mirror, and before its first batch), received at `nowMs` (Date.now());
   * `delta`: false for a snapshot.  Returns the sample taken (ms), or null.
   * @param {MirrorHeader | null | undefined} mirror
   * @param {number} nowMs
   * @param {boolean} delta
   * @returns {number | null}
   */
  ingest(mirror, nowMs, delta) {
    if (!mirror || !Number.isFinite(mirror.engine_ts) || mirror.batch === this.batch) return null;
    this.batch = mirror.batch;
    if (!delta) return null;
    const ms = nowMs - mirror.engine_ts * 1000;
    this.samples.push(ms);
    if (this.samples.length > this.keep) this.samples.shift();
    this.lastMs = ms;
    this.taken++;
    return ms;
  }

  /** The median of the samples kept, ms; null before the first. */
  p50() {
    const n = this.samples.length;
    if (!n) return null;
    const s = this.samples.slice().sort((a, b) => a - b);
    return n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
  }
}
