// The conformance scenarios (tests/conformance/scenarios) over this package's own
// ledgers (dist/stores, through test/conformance-stores.mjs), by the Node runner:
// every scenario passes, and the transcripts are byte-identical to the runner's own stores'.
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { JS, REPO, tempDir } from "./helpers.mjs";

const RUNNER = join(REPO, "tests", "conformance", "node");
const COMPONENT = process.env.ONCE_COMPONENT ??
  join(process.env.CARGO_TARGET_DIR ?? join(REPO, "target"), "once-guest", "wasm32-wasip2", "release", "once_guest.wasm");

function run(args) {
  const r = spawnSync(process.execPath, ["run.mjs", "--component", COMPONENT, ...args], { cwd: RUNNER, encoding: "utf8" });
  assert.equal(r.status, 0, `${r.stdout}\n${r.stderr}`);
  return r.stdout;
}

test("every conformance scenario over the package's memory and SQLite ledgers, transcripts identical", (t) => {
  assert.ok(existsSync(COMPONENT), `${COMPONENT} is missing: cargo build -p once-host, or set ONCE_COMPONENT`);
  if (!existsSync(join(RUNNER, "node_modules"))) execFileSync("npm", ["ci", "--no-audit", "--no-fund"], { cwd: RUNNER, stdio: "ignore" });
  const dir = tempDir(t);
  const ours = run(["--stores", join(JS, "test", "conformance-stores.mjs"), "--transcripts", join(dir, "package")]);
  const scenarios = Number(/node \(memory, typed\): (\d+) passed, 0 failed/.exec(ours)?.[1]);
  assert.ok(scenarios >= 40, ours);
  assert.match(ours, new RegExp(`node \\(sqlite, typed\\): ${scenarios} passed, 0 failed`));
  const reference = run(["--store", "memory", "--transcripts", join(dir, "runner")]);
  assert.match(reference, new RegExp(`node \\(memory, typed\\): ${scenarios} passed, 0 failed`));
  const expected = readFileSync(join(dir, "runner", "node-memory.jsonl"), "utf8");
  // The package's stores on the typed ledger, and its memory store on ledger-json too.
  for (const store of ["memory", "sqlite", "memory-json"]) {
    assert.ok(readFileSync(join(dir, "package", `node-${store}.jsonl`), "utf8") === expected, `the package's ${store} transcript differs`);
  }
});
