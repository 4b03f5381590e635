// The package as a user gets it: `npm pack`, installed into an empty project from the
// tarball (offline: its dependencies come from npm's cache, which `npm ci` filled), and a
// script there that makes every call against a dispenser.

import { test, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync, readdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { startDispenser } from "./dispenser.mjs";

const pkgDir = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const work = mkdtempSync(join(tmpdir(), "leafbus-js-pack-"));
let disp;

after(async () => {
  await disp?.stop();
  rmSync(work, { recursive: true, force: true });
});

const script = `
import { connect } from "@nats-io/transport-node";
import { createClient, LeafbusError } from "@leafbus/client";
const nc = await connect({ servers: process.argv[2] });
const leaf = createClient(nc);
await leaf.admin("add", { tag: "order.id", step: 100 });
const out = {};
out.segment = await leaf.segment("order.id");
out.snowflake = await leaf.snowflake("订单");
out.segmentN = (await leaf.segmentN("order.id", 300)).length;
out.snowflakeN = (await leaf.snowflakeN("a b", 300)).length;
out.workerId = (await leaf.decode(out.snowflake)).workerId;
const buf = leaf.buffer("segment", "order.id", { size: 100 });
for (let i = 0; i < 1000; i++) out.buffer = await buf.next();
buf.close();
try { await leaf.segment("missing"); } catch (e) { out.missing = e instanceof LeafbusError ? e.code : String(e); }
await nc.close();
console.log(JSON.stringify(out, (k, v) => (typeof v === "bigint" ? v.toString() : v)));
`;

test("npm pack installs into an empty project and every call works", async () => {
  // The build is the test run's (npm test and make test-js build first), not a second one.
  assert.ok(existsSync(join(pkgDir, "dist/index.js")), "dist/index.js missing: npm run build first");
  execFileSync("npm", ["pack", "--silent", "--ignore-scripts", "--pack-destination", work], { cwd: pkgDir, stdio: ["ignore", "ignore", "inherit"] });
  const tgz = readdirSync(work).find((f) => f.endsWith(".tgz"));
  assert.ok(tgz, "npm pack wrote no tarball");
  const project = join(work, "project");
  execFileSync("mkdir", [project]);
  writeFileSync(join(project, "package.json"), JSON.stringify({ name: "empty", version: "1.0.0", type: "module", private: true }));
  execFileSync("npm", ["install", "--offline", "--no-audit", "--no-fund", "--loglevel=error", join(work, tgz)], {
    cwd: project,
    stdio: ["ignore", "ignore", "inherit"],
    timeout: 120_000,
  });
  writeFileSync(join(project, "main.js"), script);
  disp = await startDispenser({ nodeId: "js-pack" });
  const out = JSON.parse(execFileSync("node", ["main.js", disp.url], { cwd: project, timeout: 60_000 }).toString());
  assert.ok(BigInt(out.segment) >= 1n);
  assert.ok(BigInt(out.snowflake) > 2n ** 53n);
  assert.equal(out.segmentN, 300);
  assert.equal(out.snowflakeN, 300);
  assert.equal(typeof out.workerId, "number");
  assert.ok(BigInt(out.buffer) > BigInt(out.segment));
  assert.equal(out.missing, 404);
});
