// The package as installed without its native modules: `pg` (an optional peer dependency) and `better-sqlite3`
// (the SQLite ledger's) absent. Importing it and a memory ledger need neither; a ledger that does need one is a
// StorageError that names the package to install, not a failed import.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { cpSync, mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { JS, tempDir } from "./helpers.mjs";

const CHECK = `
import assert from "node:assert/strict";
import { createRequire } from "node:module";
import { Once, StorageError, sent } from "once-exactly";

// The premise: neither native module can be resolved from here.
const require = createRequire(import.meta.url);
for (const name of ["pg", "better-sqlite3"]) assert.throws(() => require.resolve(name), { code: "MODULE_NOT_FOUND" });

const o = await Once.memory();
let runs = 0;
const refund = o.protect("refund_order", async (a) => (runs++, { refunded: a.amount }), { key: (a) => a.order_id });
assert.deepEqual(await refund({ order_id: "o-1", amount: 5 }), { refunded: 5 });
assert.deepEqual(await refund({ order_id: "o-1", amount: 5 }), { refunded: 5 });
assert.equal(runs, 1);
assert.equal((await o.inspect("default", "o-1")).state, "confirmed");
await o.close();

await assert.rejects(Once.open("postgres://localhost:1/nowhere"), (e) => {
  assert.ok(e instanceof StorageError, e.stack);
  assert.match(e.message, /^postgres: a PostgreSQL ledger needs the package pg, which is not installed: npm install pg$/);
  return true;
});
await assert.rejects(Once.sqlite("ledger.db"), (e) => {
  assert.ok(e instanceof StorageError, e.stack);
  assert.match(e.message, /^sqlite: the SQLite ledger ledger\\.db needs the package better-sqlite3, which is not installed: npm install better-sqlite3$/);
  return true;
});
console.log("ok");
`;

test("without pg and better-sqlite3: the package imports, a memory ledger protects a call, the others name the package", (t) => {
  // An application beside a copy of the package's files (what npm pack ships) and no other node_modules: the
  // temp dir has no node_modules above it, and NODE_PATH is cleared, so nothing else resolves.
  const app = tempDir(t);
  const pkg = join(app, "node_modules", "once-exactly");
  mkdirSync(pkg, { recursive: true });
  for (const part of ["dist", "gen", "package.json"]) cpSync(join(JS, part), join(pkg, part), { recursive: true });
  writeFileSync(join(app, "package.json"), JSON.stringify({ type: "module", private: true }));
  writeFileSync(join(app, "check.mjs"), CHECK);
  const out = execFileSync(process.execPath, ["check.mjs"], {
    cwd: app,
    env: { ...process.env, NODE_PATH: "" },
    encoding: "utf8",
    stdio: ["ignore", "pipe", "pipe"],
  });
  assert.equal(out.trim(), "ok");
});
