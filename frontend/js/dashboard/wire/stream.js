// @ts-check
// StreamConnection: the websocket to /api/stream, feeding a PoolModel.
//
// As docs/protocol.md (and app/stream/client.py) say: reconnect with
// exponential backoff and jitter, passing resume_from=seq+1&epoch=E so the
// server replays from its ring (or sends a snapshot; another epoch always
// gets one); on a gap send {"type":"resume","from":seq+1} and keep going.
// The token never goes in the URL: it rides in Sec-WebSocket-Protocol as
// "base64url.bearer.<token>", next to "blockpool" (the one the server echoes).

import { bearerProtocols } from "../../common/api.js";
import { MirrorLag } from "./mirrorlag.js";
import { decodeFrame } from "./protocol.js";

/**
 * What the connection has seen (the health panel and the tests read it).
 * @typedef {object} StreamHealth
 * @property {string} state connecting | open | retrying | auth | idle
 * @property {number} connects
 * @property {number} reconnects
 * @property {number} snapshots
 * @property {number} resyncs snapshots after the first of a connection
 * @property {number} gapsResumed
 * @property {number} frames
 * @property {number} bytes
 * @property {number} lastFrameAt performance.now() of the last frame
 * @property {number | null} lagMs the server's clock to this page's at the last delta (null before one)
 * @property {number} nextRetryAt
 * @property {string} lastError
 * @property {number | null} closeCode the last close's code (null while open)
 * @property {import("./protocol.js").StreamStats | null} server header.stream of the last frame
 */

export class StreamConnection {
  /**
   * @param {import("../state/model.js").PoolModel} model
   * @param {object} [opts]
   * @param {string} [opts.path] the websocket's path
   * @param {string[] | null} [opts.channels] the channels asked for (null: the server's default)
   * @param {() => string} [opts.token] the bearer token now ("" for none)
   * @param {number[]} [opts.backoff] the first and the longest wait before a reconnect, ms
   */
  constructor(model, { path = "/api/stream", channels = null, token = () => "", backoff = [250, 5000] } = {}) {
    this.model = model;
    this.path = path;
    this.channels = channels;
    this.token = token;
    this.backoff = backoff;
    this.ws = null;
    this.stopped = true;
    this.delay = backoff[0];
    /** @type {number | undefined} the pending reconnect */
    this.timer = undefined;
    /** @type {number | undefined} the liveness check, while started */
    this.watchdog = undefined;
    this.pendingResume = null; // [expected, sentAt]
    this.dropNext = 0; // tests: lose the next N delta frames
    /** @type {StreamHealth} */
    this.health = {
      state: "idle", // connecting | open | retrying | auth | idle
      connects: 0,
      reconnects: 0,
      snapshots: 0,
      resyncs: 0, // snapshots after the first of a connection
      gapsResumed: 0,
      frames: 0,
      bytes: 0,
      lastFrameAt: 0,
      lagMs: null,
      nextRetryAt: 0,
      lastError: "",
      closeCode: null,
      server: null, // header.stream of the last frame
    };
    /** @type {((health: StreamHealth) => void) | null} told of every change of the health */
    this.onchange = null;
    this._snapshotsThisConn = 0;
    this.mirrorLag = new MirrorLag(); // engine step -> this page, on a mirror service
  }

  url() {
    const loc = window.location;
    const q = new URLSearchParams();
    if (this.channels) q.set("channels", this.channels.join(","));
    const m = this.model;
    if (m.nextSeq !== null && m.epoch !== null) {
      q.set("resume_from", String(m.nextSeq));
      q.set("epoch", m.epoch);
    }
    const scheme = loc.protocol === "https:" ? "wss:" : "ws:";
    const qs = q.toString();
    return `${scheme}//${loc.host}${this.path}${qs ? `?${qs}` : ""}`;
  }

  protocols() {
    return bearerProtocols(this.token());
  }

  start() {
    if (!this.stopped) return;
    this.stopped = false;
    this._open();
    this.watchdog = setInterval(() => this._checkAlive(), 1000);
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    clearInterval(this.watchdog);
    if (this.ws) this.ws.close();
    this.ws = null;
    this.health.state = "idle";
  }

  /** Reconnect now (e.g. after a token was entered). */
  reconnectNow() {
    clearTimeout(this.timer);
    this.delay = this.backoff[0];
    if (this.ws) this.ws.close();
    else if (!this.stopped) this._open();
  }

  _open() {
    const h = this.health;
    h.state = "connecting";
    this._changed();
    let ws;
    try {
      ws = new WebSocket(this.url(), this.protocols());
    } catch (exc) {
      h.lastError = String(exc);
      this._retry();
      return;
    }
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    this._snapshotsThisConn = 0;
    this.pendingResume = null;
    ws.onopen = () => {
      if (h.connects > 0) h.reconnects++;
      h.connects++;
      h.state = "open";
      h.closeCode = null;
      h.lastFrameAt = performance.now();
      this._changed();
    };
    ws.onmessage = (ev) => this._onMessage(ev);
    ws.onerror = () => {
      h.lastError = "websocket error";
    };
    ws.onclose = (ev) => {
      if (this.ws !== ws) return;
      this.ws = null;
      h.closeCode = ev.code;
      if (ev.code === 4401) {
        h.state = "auth";
        h.lastError = "the stream needs a token";
        this._changed();
        return; // wait for reconnectNow() with a token
      }
      if (!this.stopped) this._retry();
    };
  }

  _retry() {
    const h = this.health;
    const wait = this.delay * (0.5 + Math.random());
    this.delay = Math.min(this.delay * 2, this.backoff[1]);
    h.state = "retrying";
    h.nextRetryAt = performance.now() + wait;
    this._changed();
    clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      if (!this.stopped) this._open();
    }, wait);
  }

  _checkAlive() {
    // The server sends a delta every tick: silence means a dead peer.
    const h = this.health;
    if (h.state === "open" && performance.now() - h.lastFrameAt > 5000 && this.ws) {
      h.lastError = "no frame for 5 s";
      this.ws.close();
    }
    this._changed();
  }

  /** @param {{data: ArrayBuffer | string}} ev a websocket message (binary frames as ArrayBuffers) */
  _onMessage(ev) {
    if (typeof ev.data === "string") return;
    const h = this.health;
    const recvMs = Date.now();
    h.frames++;
    h.bytes += ev.data.byteLength;
    h.lastFrameAt = performance.now();
    const frame = decodeFrame(ev.data);
    if (frame.kind === 3 && this.dropNext > 0 && this.model.seq !== null) {
      this.dropNext--;
      return; // simulated loss (tests)
    }
    const r = this.model.apply(frame);
    if (r.status === "applied" || r.status === "snapshot") this.mirrorLag.ingest(frame.header.mirror, recvMs, r.status === "applied");
    if (r.status === "snapshot") {
      h.snapshots++;
      if (this._snapshotsThisConn++ > 0) h.resyncs++;
      this.pendingResume = null;
    } else if (r.status === "applied") {
      this.pendingResume = null;
      this.delay = this.backoff[0]; // a healthy connection resets the backoff
    } else if (r.status === "gap") {
      const now = performance.now();
      const p = this.pendingResume;
      if (!p || p[0] !== r.expected || now - p[1] > 2000) {
        this.pendingResume = [r.expected, now];
        h.gapsResumed++;
        this.send({ type: "resume", from: r.expected });
      }
    }
    if (frame.header.stream) h.server = frame.header.stream;
    if (frame.kind === 3 && frame.header.ts) h.lagMs = Math.max(0, Date.now() - frame.header.ts * 1000);
  }

  /** @param {object} msg a control message: resume, snapshot, subscribe */
  send(msg) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(msg));
  }

  requestSnapshot() {
    this.send({ type: "snapshot" });
  }

  _changed() {
    if (this.onchange) this.onchange(this.health);
  }
}
