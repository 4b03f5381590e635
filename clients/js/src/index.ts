// @leafbus/client: IDs from leafbus dispensers over NATS request/reply, the protocol of
// docs/PROTOCOL.md in TypeScript. It behaves as the Go client (package client): the same
// subjects and tag encoding, the same hedging rule and delay, binary batches checked for
// count and order, and the dispenser's error replies as errors with their code.

import { headers, type Msg, type MsgHdrs, type NatsConnection } from "@nats-io/nats-core";

/** The two kinds of IDs: Leaf-segment and snowflake. */
export type Kind = "segment" | "snowflake";

/** How long an ID or decode request waits for its answer before it is sent again (ms). */
export const DEFAULT_HEDGE_MS = 50;
/** How long a call waits for its answer in all (ms). */
export const DEFAULT_TIMEOUT_MS = 5000;
/** The subject prefix of a deployment left at its default. */
export const DEFAULT_PREFIX = "leaf";
/** The most IDs one request may ask for, whatever a dispenser's --max-batch. */
export const MAX_BATCH_LIMIT = 1_000_000;
/** The longest tag, in characters (Leaf's biz_tag varchar(128)). */
export const MAX_TAG_LEN = 128;

// Hedging limits, as the Go client's: at most MAX_COPIES copies wait at once, and the
// pause between copies doubles from the hedge delay up to MAX_HEDGE_GAP_MS.
const MAX_COPIES = 16;
const MAX_HEDGE_GAP_MS = 500;

const MAX_ID = (1n << 63n) - 1n;

/**
 * An error reply of a dispenser (the Nats-Service-Error-Code and Nats-Service-Error
 * headers), or a request refused before it was sent for the reason a dispenser would
 * give (code 400), or a reply that breaks the protocol (code 0, badReply true).
 * No responders and timeouts are not LeafbusErrors: they are the NATS client's own
 * errors, as in the Go client.
 */
export class LeafbusError extends Error {
  /** 400, 404, 409, 500, 503; 0 for a reply that breaks the protocol. */
  readonly code: number;
  /** The dispenser's reason (or the local one), without the code. */
  readonly description: string;
  constructor(code: number, description: string, context?: string) {
    super(`${context ? context + ": " : ""}leafbus ${code}: ${description}`);
    this.name = "LeafbusError";
    this.code = code;
    this.description = description;
  }
  /** A reply body that breaks the protocol (a bad count, order or number). */
  get badReply(): boolean {
    return this.code === 0;
  }
}

/** Returned by IdBuffer.next once the buffer is closed. */
export class BufferClosedError extends Error {
  constructor() {
    super("leafbus: buffer closed");
    this.name = "BufferClosedError";
  }
}

/** The decode reply: a snowflake ID taken apart with the dispenser's layout. */
export interface DecodedId {
  /** The ID, as text. */
  id: string;
  /** Milliseconds since the Unix epoch (the configured epoch already added back). */
  timestamp: number;
  /** The same instant in RFC 3339 with milliseconds, UTC. */
  time: string;
  workerId: number;
  sequence: number;
}

export interface ClientOptions {
  /** The deployment's subject prefix (default "leaf"). */
  prefix?: string;
  /** Delay before an unanswered ID or decode request is sent again, ms (default 50; 0: never). */
  hedgeMs?: number;
  /** How long a call waits in all, ms (default 5000). */
  timeoutMs?: number;
}

export interface BufferOptions {
  /** IDs one background request asks for (default 1000); the buffer holds at most twice that. */
  size?: number;
}

// ---- names ----------------------------------------------------------------------------

const PREFIX_RE = /^[A-Za-z0-9_-]{1,32}$/;

function isPlainByte(c: number): boolean {
  return (
    (c >= 0x61 && c <= 0x7a) || (c >= 0x41 && c <= 0x5a) || (c >= 0x30 && c <= 0x39) || c === 0x5f || c === 0x2d
  );
}

const utf8 = new TextEncoder();
const HEX = "0123456789ABCDEF";

/** Go's strconv.Quote of a tag for messages, cut at 64 UTF-16 units as wire.Quote cuts bytes. */
function quote(s: string): string {
  return s.length > 64 ? JSON.stringify(s.slice(0, 64)) + "..." : JSON.stringify(s);
}

/**
 * checkTag returns undefined for a valid tag (1 to 128 characters of UTF-8 text, no
 * control character U+0000-U+001F, U+007F-U+009F), else the reason a dispenser gives
 * with its 400.
 */
export function checkTag(tag: string): string | undefined {
  if (typeof tag !== "string" || tag.length === 0) {
    return `tag ${quote(String(tag ?? ""))} must be 1 to ${MAX_TAG_LEN} characters long`;
  }
  if (/^[A-Za-z0-9_-]*$/.test(tag) && tag.length > MAX_TAG_LEN) {
    return `tag ${quote(tag)} must be 1 to ${MAX_TAG_LEN} characters long`;
  }
  if (!tag.isWellFormed()) {
    return `tag ${quote(tag)} is not valid UTF-8`;
  }
  let n = 0;
  for (const ch of tag) {
    const cp = ch.codePointAt(0)!;
    if (cp <= 0x1f || (cp >= 0x7f && cp <= 0x9f)) {
      return `tag ${quote(tag)} holds the control character U+${cp.toString(16).toUpperCase().padStart(4, "0")}`;
    }
    n++;
  }
  if (n > MAX_TAG_LEN) {
    return `tag ${quote(tag)} has ${n} characters, more than ${MAX_TAG_LEN}`;
  }
  return undefined;
}

/**
 * tagToken is a tag as one subject token (PROTOCOL.md "Tags on subjects and in KV keys"):
 * its UTF-8 bytes, each of A-Z a-z 0-9 _ - as it is and every other one as % and two
 * upper-case hex digits. "com.acme.order" is "com%2Eacme%2Eorder".
 */
export function tagToken(tag: string): string {
  let plain = true;
  for (let i = 0; i < tag.length; i++) {
    if (!isPlainByte(tag.charCodeAt(i))) {
      plain = false;
      break;
    }
  }
  if (plain) return tag;
  let out = "";
  for (const b of utf8.encode(tag)) {
    out += isPlainByte(b) ? String.fromCharCode(b) : "%" + HEX[b >> 4] + HEX[b & 15];
  }
  return out;
}

// ---- reply bodies ---------------------------------------------------------------------

function badReply(why: string): LeafbusError {
  return new LeafbusError(0, `bad reply: ${why}`);
}

/**
 * decodeIds reads a reply body in the encoding asked for and checks what the protocol
 * promises within one reply: at least one ID, each positive and at most 2^63-1,
 * strictly increasing, and in text no empty field or trailing newline.
 */
export function decodeIds(body: Uint8Array, binary: boolean): bigint[] {
  const ids: bigint[] = [];
  if (binary) {
    if (body.length === 0 || body.length % 8 !== 0) {
      throw badReply(`binary body of ${body.length} bytes is not a positive multiple of 8`);
    }
    const view = new DataView(body.buffer, body.byteOffset, body.byteLength);
    for (let i = 0; i < body.length; i += 8) ids.push(view.getBigUint64(i, false));
  } else {
    if (body.length === 0) throw badReply("empty body");
    let start = 0;
    for (let i = 0; i <= body.length; i++) {
      const c = i < body.length ? body[i] : 0x0a;
      if (c >= 0x30 && c <= 0x39) continue;
      if (c !== 0x0a) throw badReply(`unexpected byte ${JSON.stringify(String.fromCharCode(c))} at ${i}`);
      if (i === start) throw badReply(i === body.length ? "body ends with a newline" : `empty field at ${i}`);
      let s = "";
      for (let k = start; k < i; k++) s += String.fromCharCode(body[k]);
      const v = BigInt(s);
      if (v > MAX_ID) throw badReply(`number at byte ${start} exceeds 2^63-1`);
      ids.push(v);
      start = i + 1;
    }
  }
  for (let i = 0; i < ids.length; i++) {
    if (ids[i] < 1n || ids[i] > MAX_ID) throw badReply(`ID ${ids[i]} at position ${i} is not a positive int64`);
    if (i > 0 && ids[i] <= ids[i - 1]) throw badReply(`IDs not strictly increasing: ${ids[i]} follows ${ids[i - 1]}`);
  }
  return ids;
}

/** replyError is the service error a reply carries, or undefined. A code that is not a number counts as 500. */
function replyError(h: MsgHdrs | undefined): LeafbusError | undefined {
  const code = h?.get("Nats-Service-Error-Code") ?? "";
  if (code === "") return undefined;
  const n = /^[+-]?\d+$/.test(code) ? Number(code) : 500;
  return new LeafbusError(n, h!.get("Nats-Service-Error") ?? "");
}

// ---- errors of the NATS client --------------------------------------------------------

function isTimeout(err: unknown): boolean {
  return err instanceof Error && err.name === "TimeoutError";
}

/** isNoResponders reports whether err is the NATS client's "no responders" (no dispenser serves the subject). */
export function isNoResponders(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  if (err.name === "NoRespondersError") return true;
  const r = err as Error & { isNoResponders?: () => boolean };
  return typeof r.isNoResponders === "function" && r.isNoResponders();
}

/** isTimeoutError reports whether err is the NATS client's timeout (no answer in time). */
export function isTimeoutError(err: unknown): boolean {
  return isTimeout(err);
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// ---- the client -----------------------------------------------------------------------

/** A client of leafbus dispensers on a NATS connection, which stays the caller's to close. */
export class Client {
  readonly prefix: string;
  readonly hedgeMs: number;
  readonly timeoutMs: number;
  private readonly nc: NatsConnection;
  private readonly binaryHeaders: MsgHdrs;
  // Subjects already built, per kind: tag -> subject (bounded; a miss only re-encodes).
  private readonly subjects: Record<Kind, Map<string, string>> = { segment: new Map(), snowflake: new Map() };
  private hedgedCount = 0;
  private readonly firstWait: number; // ms the first copy of a hedged request waits

  constructor(nc: NatsConnection, opts: ClientOptions = {}) {
    const prefix = opts.prefix ?? DEFAULT_PREFIX;
    if (!PREFIX_RE.test(prefix)) {
      throw new LeafbusError(400, `prefix ${quote(prefix)}: want 1 to 32 characters of A-Z a-z 0-9 _ -`);
    }
    const hedgeMs = opts.hedgeMs ?? DEFAULT_HEDGE_MS;
    if (!(hedgeMs >= 0) || !Number.isFinite(hedgeMs)) {
      throw new LeafbusError(400, `hedgeMs ${hedgeMs}: want >= 0 (0: off)`);
    }
    const timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    if (!(timeoutMs > 0) || !Number.isFinite(timeoutMs)) {
      throw new LeafbusError(400, `timeoutMs ${timeoutMs}: want > 0`);
    }
    this.nc = nc;
    this.prefix = prefix;
    this.hedgeMs = hedgeMs;
    this.timeoutMs = timeoutMs;
    this.firstWait = Math.max(1, Math.ceil(Math.min(hedgeMs, timeoutMs)));
    this.binaryHeaders = headers();
    this.binaryHeaders.set("Leaf-Encoding", "binary");
  }

  /** How many requests this client has sent again because no answer came within hedgeMs. */
  get hedged(): number {
    return this.hedgedCount;
  }

  /** One ID of segment tag `tag`. */
  segment(tag: string): Promise<bigint> {
    return this.one("segment", tag);
  }

  /** One snowflake ID; `tag` labels the caller in the dispenser's statistics. */
  snowflake(tag: string): Promise<bigint> {
    return this.one("snowflake", tag);
  }

  /** n IDs of segment tag `tag`, strictly increasing, in one request (binary encoding). */
  segmentN(tag: string, n: number): Promise<bigint[]> {
    return this.ids("segment", tag, n);
  }

  /** n snowflake IDs, strictly increasing, in one request (binary encoding). */
  snowflakeN(tag: string, n: number): Promise<bigint[]> {
    return this.ids("snowflake", tag, n);
  }

  /** The subject that asks for IDs of kind and tag, or the 400 a dispenser would answer. */
  subject(kind: Kind, tag: string): string {
    const cache = this.subjects[kind];
    if (cache === undefined) {
      throw new LeafbusError(400, `kind ${JSON.stringify(kind)}: want "segment" or "snowflake"`);
    }
    let s = cache.get(tag);
    if (s !== undefined) return s;
    const bad = checkTag(tag);
    if (bad !== undefined) throw new LeafbusError(400, bad, `${kind} IDs for ${quote(String(tag))}`);
    s = `${this.prefix}.${kind}.${tagToken(tag)}`;
    if (cache.size < 10_000) cache.set(tag, s);
    return s;
  }

  // one asks for one ID (a text reply) with as few steps as a bare request takes.
  private one(kind: Kind, tag: string): Promise<bigint> {
    let subject: string;
    try {
      subject = this.subject(kind, tag);
    } catch (err) {
      return Promise.reject(err);
    }
    const fail = (err: unknown) => {
      throw withContext(err, `${kind} IDs for ${quote(tag)}`);
    };
    if (this.hedgeMs <= 0) return this.request(subject, undefined, undefined, this.timeoutMs).then(oneId, fail);
    // requestHedged inlined: one promise from the request to the ID when all goes well.
    const deadline = Date.now() + this.timeoutMs;
    return this.nc.request(subject, undefined, { timeout: this.firstWait }).then(
      (reply) => {
        const err = replyError(reply.headers);
        return err ? fail(err) : oneId(reply);
      },
      (err) => this.afterFirst(err, subject, undefined, undefined, deadline).then(oneId, fail),
    );
  }

  /** n IDs of the kind and tag in one request: text for one ID, binary for a batch, as the Go client asks. */
  async ids(kind: Kind, tag: string, n: number): Promise<bigint[]> {
    if (!Number.isSafeInteger(n) || n < 1 || n > MAX_BATCH_LIMIT) {
      throw new LeafbusError(400, `count ${n}: want a whole number from 1 to ${MAX_BATCH_LIMIT}`, `${kind} IDs for ${quote(String(tag))}`);
    }
    const subject = this.subject(kind, tag);
    const binary = n > 1;
    let reply: Msg;
    try {
      reply = await this.requestHedged(subject, binary ? String(n) : undefined, binary ? this.binaryHeaders : undefined);
    } catch (err) {
      throw withContext(err, `${kind} IDs for ${quote(tag)}`);
    }
    let ids: bigint[];
    try {
      ids = decodeIds(reply.data, binary);
    } catch (err) {
      throw withContext(err, `${kind} IDs for ${quote(tag)}`);
    }
    if (ids.length !== n) {
      throw new LeafbusError(0, `bad reply: ${ids.length} IDs, asked for ${n}`, `${kind} IDs for ${quote(tag)}`);
    }
    return ids;
  }

  /** Asks a dispenser to take a snowflake ID apart with its layout and epoch. */
  async decode(id: bigint | number | string): Promise<DecodedId> {
    let v: bigint;
    try {
      v = BigInt(id);
    } catch {
      throw new LeafbusError(400, `ID ${quote(String(id))} is not a whole number between 1 and 2^63-1`, "decode");
    }
    if (v < 1n || v > MAX_ID) {
      throw new LeafbusError(400, `ID ${v} is not a whole number between 1 and 2^63-1`, `decode ${v}`);
    }
    let reply: Msg;
    try {
      reply = await this.requestHedged(`${this.prefix}.decode.snowflake`, v.toString(), undefined);
    } catch (err) {
      throw withContext(err, `decode ${v}`);
    }
    let d: { id?: string; timestamp?: number; time?: string; worker_id?: number; sequence?: number };
    try {
      d = reply.json();
    } catch (err) {
      throw new LeafbusError(0, `bad reply ${quote(reply.string())}: ${(err as Error).message}`, `decode ${v}`);
    }
    return {
      ...d,
      id: d.id ?? v.toString(),
      timestamp: d.timestamp ?? 0,
      time: d.time ?? "",
      workerId: d.worker_id ?? 0,
      sequence: d.sequence ?? 0,
    } as DecodedId;
  }

  /**
   * A buffer of IDs of one kind and tag, kept in this process and refilled ahead in
   * batches of `size`, as the Go client's Buffer: next() is served from memory.
   */
  buffer(kind: Kind, tag: string, opts: BufferOptions = {}): IdBuffer {
    this.subject(kind, tag); // a bad kind or tag is refused now, not at the first next()
    return new IdBuffer(this, kind, tag, opts.size ?? 1000);
  }

  /**
   * One request, never sent twice: for admin calls (leaf.admin.tags.*), which are not
   * idempotent. The subject is under the client's prefix ("admin.tags.add"); the reply's
   * JSON is returned, an error reply thrown as LeafbusError.
   */
  async admin(op: "add" | "list" | "update", body?: unknown): Promise<unknown> {
    const data = body === undefined ? undefined : JSON.stringify(body);
    const reply = await this.request(`${this.prefix}.admin.tags.${op}`, data, undefined, this.timeoutMs);
    return reply.json();
  }

  // requestHedged is request for calls that may be answered twice (IDs, decode), with the
  // Go client's rule: the request goes out alone, waiting hedgeMs; if nothing came back,
  // copies go out at doubling intervals up to 500 ms, at most 16 waiting at once, and
  // the first answer of any copy is the answer (IDs or an error reply). A first answer
  // of "no responders" is asked once more after hedgeMs, and that answer stands. Late
  // answers are dropped: a gap in the IDs, never a duplicate.
  private requestHedged(subject: string, data: string | undefined, h: MsgHdrs | undefined): Promise<Msg> {
    if (this.hedgeMs <= 0) return this.request(subject, data, h, this.timeoutMs);
    const deadline = Date.now() + this.timeoutMs;
    return this.nc
      .request(subject, data, { timeout: this.firstWait, headers: h })
      .then(checkReply, (err) => this.afterFirst(err, subject, data, h, deadline));
  }

  // afterFirst goes on from a first request that failed with err: no responders is
  // asked once more after the hedge delay; a timeout starts the race of copies.
  private async afterFirst(err: unknown, subject: string, data: string | undefined, h: MsgHdrs | undefined, deadline: number): Promise<Msg> {
    if (isNoResponders(err)) {
      const left = deadline - Date.now();
      if (left <= this.hedgeMs) throw err;
      await sleep(this.hedgeMs);
      try {
        return await this.request(subject, data, h, Math.min(this.hedgeMs, deadline - Date.now()));
      } catch (err2) {
        if (!isTimeout(err2) || deadline - Date.now() <= 0) throw err2;
        err = err2;
      }
    } else if (!isTimeout(err) || deadline - Date.now() <= 0) {
      throw err;
    }
    return this.race(subject, data, h, deadline, err);
  }

  // race sends copies at growing intervals until one is answered or the deadline passes.
  // firstErr (a timeout) is the error when the deadline passes with no copy answered.
  private race(subject: string, data: string | undefined, h: MsgHdrs | undefined, deadline: number, firstErr: unknown): Promise<Msg> {
    return new Promise<Msg>((resolve, reject) => {
      let waiting = 0;
      let done = false;
      let gap = this.hedgeMs;
      let timer: ReturnType<typeof setTimeout> | undefined;
      let lastErr: unknown = firstErr;
      const finish = (f: () => void) => {
        if (done) return;
        done = true;
        if (timer !== undefined) clearTimeout(timer);
        f();
      };
      const send = () => {
        const left = deadline - Date.now();
        if (left < 1) return;
        this.hedgedCount++;
        waiting++;
        this.request(subject, data, h, left).then(
          (m) => finish(() => resolve(m)),
          (err) => {
            waiting--;
            lastErr = err;
            if (!isTimeout(err) || (waiting === 0 && Date.now() >= deadline)) finish(() => reject(err));
          },
        );
      };
      const tick = () => {
        if (done) return;
        const left = deadline - Date.now();
        if (left <= 0) {
          if (waiting === 0) finish(() => reject(lastErr));
          return;
        }
        if (waiting < MAX_COPIES) send();
        gap = Math.min(2 * gap, Math.max(this.hedgeMs, MAX_HEDGE_GAP_MS));
        timer = setTimeout(tick, Math.min(gap, left));
      };
      send();
      timer = setTimeout(tick, Math.min(gap, Math.max(1, deadline - Date.now())));
    });
  }

  // request sends one request and turns a service error reply into a LeafbusError.
  private request(subject: string, data: string | undefined, h: MsgHdrs | undefined, timeout: number): Promise<Msg> {
    return this.nc.request(subject, data, { timeout: Math.max(1, Math.ceil(timeout)), headers: h }).then(checkReply);
  }
}

// checkReply returns reply, or throws the service error it carries.
function checkReply(reply: Msg): Msg {
  const err = replyError(reply.headers);
  if (err) throw err;
  return reply;
}

// oneId is the ID of a text reply of one ID; anything else throws decodeIds' reason or
// a bad count.
function oneId(reply: Msg): bigint {
  const id = parseOne(reply.data);
  if (id !== undefined) return id;
  const ids = decodeIds(reply.data, false);
  throw new LeafbusError(0, `bad reply: ${ids.length} IDs, asked for 1`);
}

// parseOne is the ID of a text reply of one ID, or undefined for anything else (which
// decodeIds then names). Up to 15 digits a Number holds the value exactly.
function parseOne(body: Uint8Array): bigint | undefined {
  const n = body.length;
  if (n === 0 || n > 19) return undefined;
  let v = 0;
  for (let i = 0; i < n; i++) {
    const c = body[i];
    if (c < 0x30 || c > 0x39) return undefined;
    v = v * 10 + (c - 0x30);
  }
  if (n <= 15) return v >= 1 ? BigInt(v) : undefined;
  let s = "";
  for (let i = 0; i < n; i++) s += String.fromCharCode(body[i]);
  const b = BigInt(s);
  return b >= 1n && b <= MAX_ID ? b : undefined;
}

function withContext(err: unknown, context: string): unknown {
  if (err instanceof LeafbusError) {
    const e = new LeafbusError(err.code, err.description, context);
    return e;
  }
  return err;
}

/** createClient returns a client of the dispensers reachable on nc. */
export function createClient(nc: NatsConnection, opts: ClientOptions = {}): Client {
  return new Client(nc, opts);
}

// ---- the buffer -----------------------------------------------------------------------

const FETCH_RETRY_MIN_MS = 50;
const FETCH_RETRY_MAX_MS = 2000;

/**
 * IdBuffer keeps IDs of one kind and tag in memory, as the Go client's Buffer: it holds at
 * most two batches of `size` IDs and fetches the next batch (one binary request) as soon
 * as fewer than `size` are left, so that next() is served from memory in the steady
 * state. Every next() gets an ID no other next() got; the IDs come in the order they
 * were fetched (increasing within a batch and across batches from one dispenser).
 * The IDs it holds are lost when the process exits or close() is called: a gap, never
 * a repeat. Errors show late: next() rejects with the last fetch's error only once
 * the buffer is empty.
 */
export class IdBuffer {
  readonly kind: Kind;
  readonly tag: string;
  readonly size: number;
  private readonly client: Client;
  private batches: bigint[][] = [];
  private pos = 0; // index of the next ID in batches[0]
  private held = 0;
  private fetching = false;
  private closed = false;
  private err: unknown;
  private retryAt = 0;
  private retryMs = FETCH_RETRY_MIN_MS;
  private waiters: { resolve: (id: bigint) => void; reject: (err: unknown) => void }[] = [];

  constructor(client: Client, kind: Kind, tag: string, size: number) {
    if (!Number.isSafeInteger(size) || size < 1 || size > MAX_BATCH_LIMIT / 2) {
      throw new LeafbusError(400, `buffer size ${size}: want a whole number from 1 to ${MAX_BATCH_LIMIT / 2}`);
    }
    this.client = client;
    this.kind = kind;
    this.tag = tag;
    this.size = size;
  }

  /** How many IDs the buffer holds now. */
  get available(): number {
    return this.held;
  }

  /** The next ID: from memory when the buffer holds one, else after the fetch under way. */
  next(): Promise<bigint> {
    if (this.closed) return Promise.reject(new BufferClosedError());
    if (this.held > 0 && this.waiters.length === 0) {
      const id = this.take();
      if (this.held < this.size) this.fill();
      return Promise.resolve(id);
    }
    if (this.err !== undefined && !this.fetching && Date.now() < this.retryAt) {
      return Promise.reject(this.err);
    }
    return new Promise<bigint>((resolve, reject) => {
      this.waiters.push({ resolve, reject });
      this.fill();
    });
  }

  /** Drops the IDs held (a gap) and rejects every next() waiting and to come. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.batches = [];
    this.held = 0;
    const w = this.waiters;
    this.waiters = [];
    for (const x of w) x.reject(new BufferClosedError());
  }

  private take(): bigint {
    const b = this.batches[0];
    const id = b[this.pos++];
    this.held--;
    if (this.pos === b.length) {
      this.batches.shift();
      this.pos = 0;
    }
    return id;
  }

  // fill starts a fetch unless one is under way or the buffer has no room for a batch.
  private fill(): void {
    if (this.fetching || this.closed) return;
    if (this.held + this.size > 2 * this.size && this.waiters.length === 0) return;
    const wait = this.retryAt - Date.now();
    this.fetching = true;
    void (async () => {
      if (wait > 0) await sleep(wait);
      let ids: bigint[] | undefined;
      let err: unknown;
      try {
        ids = await this.client.ids(this.kind, this.tag, this.size);
      } catch (e) {
        err = e;
      }
      this.fetching = false;
      if (this.closed) return;
      if (ids) {
        this.err = undefined;
        this.retryAt = 0;
        this.retryMs = FETCH_RETRY_MIN_MS;
        this.batches.push(ids);
        this.held += ids.length;
        while (this.waiters.length > 0 && this.held > 0) this.waiters.shift()!.resolve(this.take());
        if (this.held < this.size || this.waiters.length > 0) this.fill();
        return;
      }
      this.err = err;
      this.retryAt = Date.now() + this.retryMs / 2 + (Math.random() * this.retryMs) / 2;
      this.retryMs = Math.min(2 * this.retryMs, FETCH_RETRY_MAX_MS);
      if (this.held === 0) {
        const w = this.waiters;
        this.waiters = [];
        for (const x of w) x.reject(err);
      } else {
        this.fill();
      }
    })();
  }
}
