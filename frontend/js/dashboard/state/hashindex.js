// @ts-check
// HashIndex: the prefix-cache hash map as the client sees it, kept
// incrementally: (hash64, group) -> the blocks holding it.
//
// Open addressing over typed arrays (no per-key objects): a slot holds the
// key (lo, hi, group), a count and the head of a doubly linked list threaded
// through per-block `next`/`prev` arrays.  add/remove are O(1); a key whose
// count falls to 0 leaves a tombstone; the table rehashes when it fills.

const EMPTY_SLOT = 0;
const LIVE = 1;
const TOMB = 2;

/**
 * @param {number} lo the hash's low 32 bits
 * @param {number} hi its high 32 bits
 * @param {number} g the KV-cache group
 */
function slotHash(lo, hi, g) {
  // hash64 is already a digest: its bits are well mixed.
  let h = lo ^ Math.imul(hi, 0x9e3779b1) ^ Math.imul(g + 1, 0x85ebca6b);
  h ^= h >>> 15;
  return h >>> 0;
}

/** @typedef {(slot: number, lo: number, hi: number, group: number, count: number) => boolean | void} SlotVisitor */

export class HashIndex {
  // Set by resize() and _alloc(), which the constructor calls: never unset.
  /** @type {number} */ n;
  /** @type {Int32Array} */ next;
  /** @type {Int32Array} */ prev;
  /** @type {Int32Array} */ slotOf;
  /** @type {number} */ cap;
  /** @type {number} */ mask;
  /** @type {Uint32Array} */ kLo;
  /** @type {Uint32Array} */ kHi;
  /** @type {Uint32Array} */ kGroup;
  /** @type {Int32Array} */ head;
  /** @type {Int32Array} */ count;
  /** @type {Uint8Array} */ flag;
  /** @type {number} */ size;
  /** @type {number} */ tombs;
  /** @type {number} */ multi;
  /** @type {number} */ blocks;

  /** @param {number} numBlocks */
  constructor(numBlocks) {
    this.resize(numBlocks);
  }

  /** @param {number} numBlocks */
  resize(numBlocks) {
    this.n = numBlocks;
    this.next = new Int32Array(numBlocks).fill(-1);
    this.prev = new Int32Array(numBlocks).fill(-1);
    this.slotOf = new Int32Array(numBlocks).fill(-1);
    this._alloc(64);
  }

  /** @param {number} cap slots, a power of two */
  _alloc(cap) {
    this.cap = cap;
    this.mask = cap - 1;
    this.kLo = new Uint32Array(cap);
    this.kHi = new Uint32Array(cap);
    this.kGroup = new Uint32Array(cap);
    this.head = new Int32Array(cap).fill(-1);
    this.count = new Int32Array(cap);
    this.flag = new Uint8Array(cap);
    this.size = 0; // live keys
    this.tombs = 0;
    this.multi = 0; // live keys with >= 2 blocks
    this.blocks = 0; // indexed blocks
  }

  clear() {
    this.next.fill(-1);
    this.prev.fill(-1);
    this.slotOf.fill(-1);
    this._alloc(64);
  }

  /**
   * Rebuild from whole columns (a snapshot). hash64 is [lo, hi] pairs.
   * @param {ArrayLike<number>} hashed non-zero: the block has a hash
   * @param {ArrayLike<number>} hash64
   * @param {ArrayLike<number>} group
   */
  rebuild(hashed, hash64, group) {
    const n = hashed.length;
    if (n !== this.n) this.resize(n);
    else this.clear();
    let cnt = 0;
    for (let i = 0; i < n; i++) if (hashed[i]) cnt++;
    let cap = 64;
    while (cap < cnt * 2) cap <<= 1;
    this._alloc(cap);
    for (let i = 0; i < n; i++) {
      if (hashed[i]) this.add(i, hash64[2 * i], hash64[2 * i + 1], group[i]);
    }
  }

  /**
   * The slot of a key, or -1.
   * @param {number} lo the hash's low 32 bits
   * @param {number} hi its high 32 bits
   * @param {number} g the KV-cache group
   */
  find(lo, hi, g) {
    const { mask, flag, kLo, kHi, kGroup } = this;
    let i = slotHash(lo, hi, g) & mask;
    for (;;) {
      const f = flag[i];
      if (f === EMPTY_SLOT) return -1;
      if (f === LIVE && kLo[i] === lo && kHi[i] === hi && kGroup[i] === g) return i;
      i = (i + 1) & mask;
    }
  }

  /**
   * Index block `id` under a key (moved there when it was under another); returns the slot.
   * @param {number} id
   * @param {number} lo the hash's low 32 bits
   * @param {number} hi its high 32 bits
   * @param {number} g the KV-cache group
   */
  add(id, lo, hi, g) {
    if (this.slotOf[id] !== -1) this.remove(id);
    if ((this.size + this.tombs + 1) * 2 > this.cap) this._rehash();
    const { mask, flag, kLo, kHi, kGroup } = this;
    let i = slotHash(lo, hi, g) & mask;
    let tomb = -1;
    for (;;) {
      const f = flag[i];
      if (f === EMPTY_SLOT) break;
      if (f === TOMB) {
        if (tomb < 0) tomb = i;
      } else if (kLo[i] === lo && kHi[i] === hi && kGroup[i] === g) {
        this._link(i, id);
        return i;
      }
      i = (i + 1) & mask;
    }
    if (tomb >= 0) {
      i = tomb;
      this.tombs--;
    }
    flag[i] = LIVE;
    kLo[i] = lo;
    kHi[i] = hi;
    kGroup[i] = g;
    this.head[i] = -1;
    this.count[i] = 0;
    this.size++;
    this._link(i, id);
    return i;
  }

  /**
   * @param {number} slot
   * @param {number} id
   */
  _link(slot, id) {
    const h = this.head[slot];
    this.next[id] = h;
    this.prev[id] = -1;
    if (h >= 0) this.prev[h] = id;
    this.head[slot] = id;
    this.slotOf[id] = slot;
    const c = ++this.count[slot];
    if (c === 2) this.multi++;
    this.blocks++;
  }

  /** @param {number} id a block (nothing when it is not indexed) */
  remove(id) {
    const slot = this.slotOf[id];
    if (slot < 0) return;
    const p = this.prev[id];
    const nx = this.next[id];
    if (p >= 0) this.next[p] = nx;
    else this.head[slot] = nx;
    if (nx >= 0) this.prev[nx] = p;
    this.next[id] = -1;
    this.prev[id] = -1;
    this.slotOf[id] = -1;
    this.blocks--;
    const c = --this.count[slot];
    if (c === 1) this.multi--;
    if (c === 0) {
      this.flag[slot] = TOMB;
      this.head[slot] = -1;
      this.size--;
      this.tombs++;
    }
  }

  _rehash() {
    const old = {
      cap: this.cap,
      flag: this.flag,
      kLo: this.kLo,
      kHi: this.kHi,
      kGroup: this.kGroup,
      head: this.head,
      count: this.count,
    };
    let cap = 64;
    while (cap < (this.size + 1) * 4) cap <<= 1;
    const blocks = this.blocks;
    const multi = this.multi;
    this._alloc(cap);
    const { mask, flag, kLo, kHi, kGroup, head, count } = this;
    for (let s = 0; s < old.cap; s++) {
      if (old.flag[s] !== LIVE) continue;
      const lo = old.kLo[s];
      const hi = old.kHi[s];
      const g = old.kGroup[s];
      let i = slotHash(lo, hi, g) & mask;
      while (flag[i] !== EMPTY_SLOT) i = (i + 1) & mask;
      flag[i] = LIVE;
      kLo[i] = lo;
      kHi[i] = hi;
      kGroup[i] = g;
      head[i] = old.head[s];
      count[i] = old.count[s];
      this.size++;
      for (let id = head[i]; id >= 0; id = this.next[id]) this.slotOf[id] = i;
    }
    this.blocks = blocks;
    this.multi = multi;
  }

  /**
   * Block ids under a slot, ascending.
   * @param {number} slot
   */
  idsOf(slot) {
    /** @type {number[]} */
    const out = [];
    if (slot < 0 || this.flag[slot] !== LIVE) return out;
    for (let id = this.head[slot]; id >= 0; id = this.next[id]) out.push(id);
    return out.sort((a, b) => a - b);
  }

  /**
   * Ids of the blocks holding the same (hash, group) as block `id` (itself included).
   * @param {number} id
   */
  sameAs(id) {
    return this.idsOf(this.slotOf[id]);
  }

  /**
   * Visit live slots: fn(slot, lo, hi, group, count); stop when it returns false.
   * @param {SlotVisitor} fn
   */
  forEach(fn) {
    const { cap, flag, kLo, kHi, kGroup, count } = this;
    for (let s = 0; s < cap; s++) {
      if (flag[s] === LIVE && fn(s, kLo[s], kHi[s], kGroup[s], count[s]) === false) return;
    }
  }

  /** Slots holding several physical copies (up to `limit`). */
  multiSlots(limit = 100) {
    /** @type {number[]} */
    const out = [];
    this.forEach((s, _lo, _hi, _g, c) => {
      if (c >= 2) out.push(s);
      return out.length < limit;
    });
    return out;
  }

  /**
   * Slots whose 16-digit hash starts with `prefix` (1..16 hex digits),
   * compared on the numbers: no strings per key.
   * @param {string} prefix
   */
  searchPrefix(prefix, limit = 100) {
    const p = prefix.toLowerCase();
    /** @type {number[]} */
    const out = [];
    if (!/^[0-9a-f]{1,16}$/.test(p)) return out;
    const hiDigits = Math.min(p.length, 8);
    const hiShift = 32 - 4 * hiDigits;
    const hiVal = parseInt(p.slice(0, hiDigits), 16) >>> 0;
    const loDigits = p.length - hiDigits;
    const loShift = 32 - 4 * loDigits;
    const loVal = loDigits ? parseInt(p.slice(8), 16) >>> 0 : 0;
    this.forEach((s, lo, hi) => {
      const hiOk = hiShift === 0 ? hi === hiVal : hi >>> hiShift === hiVal;
      if (!hiOk) return true;
      if (loDigits && (loShift === 0 ? lo !== loVal : lo >>> loShift !== loVal)) return true;
      out.push(s);
      return out.length < limit;
    });
    return out;
  }

  /** (hash, group) -> ids for every key: the mirror's hash_map() (tests). */
  entries() {
    /** @type {[number, number, number, number[]][]} */
    const out = [];
    this.forEach((s, lo, hi, g) => {
      out.push([lo, hi, g, this.idsOf(s)]);
    });
    return out;
  }
}
