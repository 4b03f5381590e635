// The Node client against the real dispenser binary: every call, tags of any text, the
// error codes, batches in both encodings, a buffer of 100,000 IDs, hedging around a
// SIGSTOPped dispenser, and the table of cases the Go client is tested against too
// (clients/testdata/cases.json, read by client/cases_test.go).

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { connect } from "@nats-io/transport-node";
import { headers } from "@nats-io/nats-core";
import { createClient, LeafbusError, BufferClosedError, decodeIds, isNoResponders, tagToken } from "../dist/index.js";
import { startDispenser, repoRoot } from "./dispenser.mjs";

const cases = JSON.parse(readFileSync(join(repoRoot, "clients/testdata/cases.json"), "utf8"));

let disp; // the dispenser with its embedded NATS
let nc;
let client;

before(async () => {
  disp = await startDispenser({ nodeId: "js-a" });
  nc = await connect({ servers: disp.url, timeout: 10_000 });
  client = createClient(nc, { timeoutMs: 10_000 });
  await client.admin("add", { tag: "orders", step: 1000 });
});

after(async () => {
  await nc?.close();
  await disp?.stop();
});

/** rejects asserts that p rejects with a LeafbusError of code (and, when given, a description containing part). */
async function rejectsWith(p, code, part) {
  await assert.rejects(p, (err) => {
    assert.ok(err instanceof LeafbusError, `want a LeafbusError, got ${err}`);
    assert.equal(err.code, code, String(err));
    if (part !== undefined) assert.ok(err.description.includes(part), `${err.description} does not say ${part}`);
    return true;
  });
}

function increasing(ids) {
  for (let i = 1; i < ids.length; i++) assert.ok(ids[i] > ids[i - 1], `${ids[i]} follows ${ids[i - 1]}`);
}

test("every call", async () => {
  const a = await client.segment("orders");
  const b = await client.segment("orders");
  assert.equal(typeof a, "bigint");
  assert.ok(b > a);
  const s = await client.snowflake("orders");
  assert.equal(typeof s, "bigint");
  assert.ok(s > 2n ** 53n, `snowflake ${s} should exceed 2^53`);
  const seg = await client.segmentN("orders", 500);
  assert.equal(seg.length, 500);
  increasing(seg);
  assert.ok(seg[0] > b);
  const sf = await client.snowflakeN("any tag", 1000);
  assert.equal(sf.length, 1000);
  increasing(sf);
  const d = await client.decode(s);
  assert.equal(d.id, s.toString());
  assert.ok(Math.abs(d.timestamp - Date.now()) < 60_000, `timestamp ${d.timestamp}`);
  assert.equal(typeof d.workerId, "number");
  assert.equal(typeof d.sequence, "number");
  assert.equal(new Date(d.time).getTime(), d.timestamp);
  const again = await client.decode(s.toString());
  assert.equal(again.workerId, d.workerId);
  await rejectsWith(client.decode(0n), 400);
  await rejectsWith(client.decode("abc"), 400);
  const tags = await client.admin("list");
  assert.ok(tags.some((t) => t.tag === "orders"));
});

test("tags of any text: encoded as PROTOCOL.md says, served by the dispenser", async () => {
  for (const { tag, token } of cases.tags) {
    assert.equal(tagToken(tag), token, tag);
    assert.equal(client.subject("segment", tag), `leaf.segment.${token}`);
    if (tag !== "orders") await client.admin("add", { tag, step: 10 });
    const id = await client.segment(tag);
    const ids = await client.segmentN(tag, 20); // spans two segments of 10
    assert.equal(ids.length, 20);
    increasing(ids);
    assert.ok(ids[0] > id);
    await client.snowflake(tag);
    // The raw subject is the one the dispenser answers on.
    const raw = await nc.request(`leaf.segment.${token}`, undefined, { timeout: 10_000 });
    assert.equal(raw.headers?.get("Nats-Service-Error-Code") ?? "", "", `${tag}: ${raw.headers?.get("Nats-Service-Error")}`);
  }
});

test("invalid tags are refused before a request, as a dispenser refuses them", async () => {
  for (const { tag, reason } of cases.invalid_tags) {
    await rejectsWith(client.segment(tag), 400, reason);
    await rejectsWith(client.snowflakeN(tag, 3), 400, reason);
    assert.throws(() => client.buffer("segment", tag), LeafbusError);
  }
  // A tag the client would refuse, sent anyway, gets the same 400 from the dispenser.
  const raw = await nc.request("leaf.segment.a%00b", undefined, { timeout: 10_000 });
  assert.equal(raw.headers?.get("Nats-Service-Error-Code"), "400");
  assert.ok(raw.headers?.get("Nats-Service-Error").includes("holds the control character U+0000"));
});

test("404 and 400 from the dispenser", async () => {
  await rejectsWith(client.segment("no-such-tag"), 404);
  await rejectsWith(client.segmentN("no such tag", 5), 404);
  await rejectsWith(client.segmentN("orders", 20_000), 400, "between 1 and 10000"); // over --max-batch
  await rejectsWith(client.segmentN("orders", 0), 400); // refused here
  await rejectsWith(client.admin("add", { tag: "orders", step: 1000 }), 409);
  await rejectsWith(client.admin("update", { tag: "no-such-tag", step: 5 }), 404);
  await rejectsWith(client.admin("add", { tag: "x", step: 0 }), 400);
});

test("batches in both encodings", async () => {
  const text = await nc.request("leaf.segment.orders", "100", { timeout: 10_000 });
  const t = decodeIds(text.data, false);
  assert.equal(t.length, 100);
  increasing(t);
  const h = headers();
  h.set("Leaf-Encoding", "binary");
  const bin = await nc.request("leaf.snowflake.orders", "100", { timeout: 10_000, headers: h });
  assert.equal(bin.data.length, 800);
  const b = decodeIds(bin.data, true);
  assert.equal(b.length, 100);
  increasing(b);
  // The client asks for binary for a batch and text for one ID.
  const ids = await client.segmentN("orders", 10_000);
  assert.equal(ids.length, 10_000);
  increasing(ids);
});

test("a buffer: 100,000 next() calls, all distinct, increasing, one request per batch", async () => {
  // The connection as the client sees it, counting its requests.
  let requests = 0;
  const counting = new Proxy(nc, {
    get(target, prop) {
      if (prop === "request") {
        return (...args) => {
          requests++;
          return target.request(...args);
        };
      }
      const v = target[prop];
      return typeof v === "function" ? v.bind(target) : v;
    },
  });
  const buf = createClient(counting, { timeoutMs: 10_000 }).buffer("segment", "orders", { size: 1000 });
  let last = 0n;
  const n = 100_000;
  const seen = new Set();
  // Concurrent next() calls, 1000 at a time: each gets an ID of its own.
  for (let i = 0; i < n; i += 1000) {
    const got = await Promise.all(Array.from({ length: 1000 }, () => buf.next()));
    for (const id of got) {
      assert.ok(id > last, `${id} after ${last}`);
      last = id;
      seen.add(id);
    }
  }
  assert.equal(seen.size, n);
  assert.ok(buf.available <= 2000);
  // 100 batches of 1000 and the one fetched ahead, not one per next(); copies only of fetches slower than the hedge delay.
  assert.ok(requests >= 100 && requests <= 200, `${requests} requests for ${n} IDs in batches of 1000`);
  buf.close();
  await assert.rejects(buf.next(), BufferClosedError);
  const sf = client.buffer("snowflake", "orders", { size: 100 });
  const a = await sf.next();
  const b = await sf.next();
  assert.ok(b > a);
  sf.close();
});

test("a buffer reports a fetch's error once it is empty", async () => {
  const buf = client.buffer("segment", "no-such-buffer-tag", { size: 10 });
  await rejectsWith(buf.next(), 404);
  buf.close();
});

test("the table of replies and decodes (shared with the Go client)", async () => {
  // A responder under another prefix on the same NATS server answers as each case says.
  const byToken = new Map(cases.replies.map((c) => [tagToken(`case-${c.name}`), c]));
  const sub = nc.subscribe("conf.segment.*", {
    callback: (_err, m) => {
      const c = byToken.get(m.subject.slice("conf.segment.".length));
      const h = headers();
      for (const [k, v] of Object.entries(c.headers ?? {})) h.set(k, v);
      const body = c.body_hex !== undefined ? Buffer.from(c.body_hex, "hex") : Buffer.from(c.body ?? "");
      m.respond(body, { headers: h });
    },
  });
  await nc.flush();
  const conf = createClient(nc, { prefix: "conf", timeoutMs: 10_000 });
  try {
    for (const c of cases.replies) {
      const p = c.n === 1 ? conf.segment(`case-${c.name}`).then((id) => [id]) : conf.segmentN(`case-${c.name}`, c.n);
      if (c.ids) {
        assert.deepEqual(await p, c.ids.map(BigInt), c.name);
      } else if (c.bad_reply) {
        await assert.rejects(p, (err) => err instanceof LeafbusError && err.badReply, c.name);
      } else {
        await rejectsWith(p, c.code, c.description);
        await p.catch((err) => assert.equal(err.description, c.description, c.name));
      }
    }
    // Decode replies: the fields the Go client gives too.
    const byId = new Map(cases.decodes.map((d) => [d.id, d]));
    const dsub = nc.subscribe("conf.decode.snowflake", {
      callback: (_err, m) => {
        const d = byId.get(m.string());
        if (!d) return; // the client sent another body: the call times out and fails
        const h = headers();
        for (const [k, v] of Object.entries(d.headers ?? {})) h.set(k, v);
        m.respond(d.reply ?? "", { headers: h });
      },
    });
    await nc.flush();
    try {
      for (const d of cases.decodes) {
        if (d.code) {
          await rejectsWith(conf.decode(BigInt(d.id)), d.code, d.description);
          continue;
        }
        const got = await conf.decode(BigInt(d.id));
        assert.deepEqual(
          { id: got.id, timestamp: got.timestamp, time: got.time, workerId: got.workerId, sequence: got.sequence },
          { id: d.id, timestamp: d.timestamp, time: d.time, workerId: d.worker_id, sequence: d.sequence },
        );
      }
    } finally {
      dsub.unsubscribe();
    }
  } finally {
    sub.unsubscribe();
  }
});

test("no responders is the NATS client's error, asked once more after the hedge delay", async () => {
  const none = createClient(nc, { prefix: "nobody", hedgeMs: 20 });
  const start = Date.now();
  await assert.rejects(none.segment("orders"), (err) => isNoResponders(err));
  assert.ok(Date.now() - start >= 19, "no-responders was not asked again after the delay");
});

test("admin calls are never repeated", async () => {
  let got = 0;
  const sub = nc.subscribe("slow.admin.tags.add", { callback: () => got++ });
  await nc.flush();
  const slow = createClient(nc, { prefix: "slow", hedgeMs: 10, timeoutMs: 300 });
  await assert.rejects(slow.admin("add", { tag: "t", step: 1 }), (err) => err.name === "TimeoutError");
  const ids = createClient(nc, { prefix: "slow", hedgeMs: 10, timeoutMs: 300 });
  let idRequests = 0;
  const sub2 = nc.subscribe("slow.segment.*", { callback: () => idRequests++ });
  await nc.flush();
  await assert.rejects(ids.segment("t"), (err) => err.name === "TimeoutError");
  await nc.flush();
  sub.unsubscribe();
  sub2.unsubscribe();
  assert.equal(got, 1);
  assert.ok(idRequests > 1, `an unanswered ID request was sent ${idRequests} times`);
  assert.ok(ids.hedged > 0);
});

test("hedging: one of two dispensers SIGSTOPped, no call fails", async () => {
  const second = await startDispenser({ nats: disp.url, nodeId: "js-b" });
  try {
    const c = createClient(nc, { hedgeMs: 20, timeoutMs: 10_000 });
    await c.segment("orders");
    second.proc.kill("SIGSTOP");
    let failed = 0;
    const seen = new Set();
    for (let i = 0; i < 15; i++) {
      try {
        for (const id of [await c.segment("orders"), await c.snowflake("orders")]) {
          assert.ok(!seen.has(id), `ID ${id} twice`);
          seen.add(id);
        }
        const batch = await c.segmentN("orders", 50);
        for (const id of batch) {
          assert.ok(!seen.has(id), `ID ${id} twice`);
          seen.add(id);
        }
      } catch (err) {
        if (err instanceof assert.AssertionError) throw err;
        failed++;
      }
    }
    assert.equal(failed, 0);
    assert.ok(c.hedged > 0, "no request was sent again, yet the queue group sends some to the stopped dispenser");
  } finally {
    second.proc.kill("SIGCONT");
    await second.stop();
  }
});
