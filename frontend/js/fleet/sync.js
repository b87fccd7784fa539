// @ts-check
// The selected instance's map on the dashboard's sync model: one snapshot
// (GET /api/fleet/{name}/snapshot, with the `event_log_seq` it includes),
// then the stream's events for that instance applied in order to the page's
// own hash map (InstanceMap) and prefix tree (common/prefixtree.js).  REST
// is read again only when the copy can no longer follow: another instance
// selected, an event missing (a `seq` skipped: a tick left events out, or
// messages were lost), a `resync` or a reconnect, the instance's log ahead
// of what was applied, or its map started over without an event
// (`state_resets` moved: a gap its publisher could not replay).

import { PrefixTree } from "../common/prefixtree.js";
import { InstanceMap } from "./instancemap.js";

/** @typedef {import("./api.js").FleetEvent} FleetEvent */
/** @typedef {import("./api.js").FleetInstance} FleetInstance */

export class InstanceSync {
  /**
   * @param {{read: (name: string) => Promise<import("./instancemap.js").Snapshot>, onChange: () => void, onError: (err: Error) => void}} opts
   *   read: the snapshot; onChange: the copy changed (draw it)
   */
  constructor({ read, onChange, onError }) {
    this.read = read;
    this.onChange = onChange;
    this.onError = onError;
    /** @type {string | null} */
    this.name = null;
    this.map = new InstanceMap();
    this.tree = new PrefixTree();
    this.loading = false;
    /** @type {FleetEvent[]} the instance's events that came while the snapshot was read */
    this.pending = [];
    this.generation = 0;
    /** snapshots read, and why (the page shows it; the tests count it) */
    this.reads = 0;
    this.lastReason = "";
    /** when the last read failed (ms; 0: none since one succeeded) */
    this.failedAt = 0;
  }

  /** @param {string | null} name */
  select(name) {
    this.name = name;
    this.map = new InstanceMap();
    this.tree.clear();
    this.generation += 1; // a read still out is for the last one
    this.loading = false;
    this.onChange();
    this.reread("selected");
  }

  /**
   * Read the snapshot (again).  One read at a time: events that come
   * meanwhile wait, and a gap among them asks for the next read.
   * @param {string} reason
   */
  async reread(reason) {
    const name = this.name;
    if (name === null || this.loading) return;
    const generation = this.generation;
    this.loading = true;
    this.pending = [];
    this.reads += 1;
    this.lastReason = reason;
    let snap;
    try {
      snap = await this.read(name);
    } catch (err) {
      if (generation === this.generation) {
        this.loading = false;
        this.failedAt = Date.now();
        this.onError(err);
      }
      return;
    }
    if (generation !== this.generation) return;
    this.loading = false;
    this.failedAt = 0;
    this.map.load(snap);
    this.tree.clear();
    this.tree.load(snap.items);
    const waiting = this.pending;
    this.pending = [];
    this.applyEvents(waiting);
    this.onChange();
  }

  /**
   * A tick of the stream: its events (every instance's) and the instances'
   * health as of the same moment.
   * @param {FleetEvent[]} events
   * @param {FleetInstance[]} instances
   */
  tick(events, instances) {
    if (this.name === null) return;
    const mine = events.filter((e) => e.instance === this.name);
    if (this.loading) {
      this.pending.push(...mine);
      return;
    }
    if (mine.length && this.applyEvents(mine)) this.onChange();
    if (this.loading) return; // a gap: reading
    if (this.map.logSeq === null) {
      // no snapshot: the read failed (shown); again, no more than every 2 s
      if (this.failedAt && Date.now() - this.failedAt >= 2000) this.reread("retry after an error");
      return;
    }
    const me = instances.find((i) => i.name === this.name);
    if (!me) return;
    // the health is taken after the tick's events: a log ahead of the copy
    // lost events without a gap to show it (before a reconnect's first tick)
    if (me.event_log_seq > this.map.logSeq) this.reread("behind the log");
    else if (me.state_resets > this.map.resets) this.reread("the map started over");
  }

  /**
   * Apply events in log order; a gap stops them and reads again.
   * @param {FleetEvent[]} events
   * @returns {boolean} something applied
   */
  applyEvents(events) {
    let changed = false;
    const sorted = events.slice().sort((a, b) => a.seq - b.seq);
    for (const ev of sorted) {
      const done = this.map.apply(ev);
      if (done === "gap") {
        this.reread(`events ${(this.map.logSeq || 0) + 1}–${ev.seq - 1} missing`);
        return changed;
      }
      if (done !== "applied") continue;
      changed = true;
      if (ev.type === "BlockStored") this.tree.stored(ev.block_hashes || [], ev.parent_block_hash);
      else if (ev.type === "AllBlocksCleared") this.tree.clear();
    }
    return changed;
  }
}
