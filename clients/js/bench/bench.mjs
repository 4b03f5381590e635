// Benchmark of @leafbus/client (not a test): the client's single-ID rate against a bare
// nc.request loop to the same dispenser process, and buffer.next() per call.
//
//   cd clients/js && npm run build && node bench/bench.mjs [--nats URL] [--rounds 5] [--ms 2000]
//
// Without --nats it starts the dispenser binary (LEAFBUS_DISPENSER_BIN, or built with go
// build) on a free port. Rounds alternate bare and client (A/B, A/B, ...) so that load
// from elsewhere hits both alike; the figures are the medians.

import { parseArgs } from "node:util";
import { connect } from "@nats-io/transport-node";
import { createClient } from "../dist/index.js";
import { startDispenser } from "../test/dispenser.mjs";

const { values } = parseArgs({
  options: {
    nats: { type: "string" },
    rounds: { type: "string", default: "5" },
    ms: { type: "string", default: "2000" },
    concurrency: { type: "string", default: "1,32" },
  },
});
const rounds = Number(values.rounds);
const ms = Number(values.ms);

let disp;
let url = values.nats;
if (!url) {
  disp = await startDispenser({ nodeId: "js-bench" });
  url = disp.url;
}
const nc = await connect({ servers: url });
const client = createClient(nc);
const tag = "js-bench";
try {
  await client.admin("add", { tag, step: 100_000 });
} catch (err) {
  if (err.code !== 409) throw err;
}

// rate runs `workers` loops of one(), each awaiting its call, for ms: calls per second,
// and this process's CPU time per call in microseconds (what the client adds to a call,
// which other load on the host disturbs far less than the rate).
const cpu = [];
async function rate(one, workers) {
  let n = 0;
  const end = performance.now() + ms;
  const start = performance.now();
  const cpu0 = process.cpuUsage();
  await Promise.all(
    Array.from({ length: workers }, async () => {
      while (performance.now() < end) {
        await one();
        n++;
      }
    }),
  );
  const used = process.cpuUsage(cpu0);
  cpu.push((used.user + used.system) / n);
  return n / ((performance.now() - start) / 1000);
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const subject = `leaf.segment.${tag}`;
const bare = () => nc.request(subject, undefined, { timeout: 5000 });
const viaClient = () => client.segment(tag);

// Warm up both paths (JIT, the dispenser's segments).
await rate(bare, 8);
await rate(viaClient, 8);

const lines = [];
for (const workers of values.concurrency.split(",").map(Number)) {
  const a = [];
  const b = [];
  const ca = [];
  const cb = [];
  for (let r = 0; r < rounds; r++) {
    a.push(await rate(bare, workers));
    ca.push(cpu.at(-1));
    b.push(await rate(viaClient, workers));
    cb.push(cpu.at(-1));
  }
  const ratios = a.map((x, i) => b[i] / x);
  lines.push(
    `single ID, ${workers} in flight: bare nc.request ${median(a).toFixed(0)}/s, client.segment ${median(b).toFixed(0)}/s, ` +
      `ratio ${median(ratios).toFixed(2)} (rounds: ${ratios.map((x) => x.toFixed(2)).join(" ")}); ` +
      `CPU per call ${median(ca).toFixed(1)} µs bare, ${median(cb).toFixed(1)} µs client`,
  );
  console.log(lines.at(-1));
}
console.log(`requests the client sent again (hedged): ${client.hedged}`);

// buffer.next(): awaited one at a time, as a caller does; ns per call over the run,
// fetches included.
const perCall = [];
for (let r = 0; r < rounds; r++) {
  const buf = client.buffer("segment", tag, { size: 1000 });
  await buf.next();
  const n = 1_000_000;
  const start = process.hrtime.bigint();
  for (let i = 0; i < n; i++) await buf.next();
  perCall.push(Number(process.hrtime.bigint() - start) / n);
  buf.close();
}
lines.push(`buffer.next() (size 1000): ${median(perCall).toFixed(0)} ns per call (rounds: ${perCall.map((x) => x.toFixed(0)).join(" ")})`);
console.log(lines.at(-1));

await nc.close();
await disp?.stop();
