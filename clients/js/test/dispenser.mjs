// Starting the real dispenser binary for the tests and the benchmark: built once with
// `go build ./cmd/dispenser` (or taken from LEAFBUS_DISPENSER_BIN), run with its embedded
// NATS on a free loopback port and a temp data dir, ready when its banner names the
// segment subject (as cmd/dispenser's e2e tests wait for it).

import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
export const repoRoot = resolve(here, "../../..");

let built;

/** The dispenser binary: LEAFBUS_DISPENSER_BIN, or built once into a temp dir. */
export function dispenserBinary() {
  if (process.env.LEAFBUS_DISPENSER_BIN) return process.env.LEAFBUS_DISPENSER_BIN;
  if (built) return built;
  const dir = mkdtempSync(join(tmpdir(), "leafbus-js-bin-"));
  const bin = join(dir, "dispenser");
  execFileSync("go", ["build", "-o", bin, "./cmd/dispenser"], { cwd: repoRoot, stdio: ["ignore", "inherit", "inherit"] });
  process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
  built = bin;
  return bin;
}

/** A free TCP port on 127.0.0.1 (bound and released; the dispenser binds it next). */
export function freePort() {
  return new Promise((resolvePort, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolvePort(port));
    });
  });
}

/**
 * startDispenser runs the binary. Without opts.nats it runs its own embedded NATS on a
 * free port; with it, it joins that server. Resolves { url, proc, stop, stderr } once
 * the dispenser serves; rejects with its stderr if it exits or is not ready in 60 s.
 */
export async function startDispenser({ nats, nodeId = "js-test", args = [] } = {}) {
  const bin = dispenserBinary();
  const dataDir = mkdtempSync(join(tmpdir(), "leafbus-js-data-"));
  let url = nats;
  const all = ["--data-dir", dataDir, "--node-id", nodeId, "--http", ""];
  if (!url) {
    const port = await freePort();
    url = `nats://127.0.0.1:${port}`;
    all.push("--listen", `127.0.0.1:${port}`);
  } else {
    all.push("--nats", url);
  }
  all.push(...args);
  const proc = spawn(bin, all, { stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  proc.stderr.on("data", (b) => {
    stderr += b;
    if (stderr.length > 200_000) stderr = stderr.slice(-100_000);
  });
  const exited = new Promise((r) => proc.once("exit", (code, signal) => r({ code, signal })));
  const stop = async () => {
    if (proc.exitCode === null && proc.signalCode === null) {
      try {
        proc.kill("SIGCONT");
      } catch {}
      proc.kill("SIGTERM");
      const t = setTimeout(() => proc.kill("SIGKILL"), 10_000);
      await exited;
      clearTimeout(t);
    }
    rmSync(dataDir, { recursive: true, force: true });
  };
  let out = "";
  await new Promise((ok, fail) => {
    const timer = setTimeout(() => {
      fail(new Error(`dispenser not ready within 60s\nstderr:\n${stderr}`));
    }, 60_000);
    proc.stdout.on("data", (b) => {
      out += b;
      if (out.includes("req leaf.segment.")) {
        clearTimeout(timer);
        ok();
      }
    });
    exited.then(({ code, signal }) => {
      clearTimeout(timer);
      fail(new Error(`dispenser exited (${code ?? signal}) before it was ready\nstderr:\n${stderr}`));
    });
  }).catch(async (err) => {
    await stop();
    throw err;
  });
  proc.stdout.resume();
  return { url, proc, stop, stderr: () => stderr, dataDir };
}

