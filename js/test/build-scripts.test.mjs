// What `npm run build` and `npm test` ask cargo for (issue 32, item 11): the build compiles the guest
// component alone (no wasmtime, no host crate), and npm test's pretest builds the binaries the tests
// drive, so `npm test` after `npm run build` works on a fresh clone. A stand-in `cargo` on PATH (and in
// $CARGO) records each invocation and fails the build, so nothing is compiled and gen/ and dist/ are
// left as they are; the target directory is an empty temporary one, as on a fresh clone.
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { chmodSync, existsSync, readFileSync, writeFileSync } from "node:fs";
import { delimiter, join } from "node:path";
import { test } from "node:test";
import { JS, REPO, tempDir } from "./helpers.mjs";

/** Run `script` (a file of js/scripts) with the stand-in cargo; its exit status and the cargo commands it ran. */
function withStandInCargo(t, script, exitCode) {
  const dir = tempDir(t);
  const log = join(dir, "cargo.log");
  const cargo = join(dir, "cargo");
  writeFileSync(
    cargo,
    `#!/bin/sh\nif [ "$1" = "--version" ]; then echo "cargo 0.0.0 (stand-in)"; exit 0; fi\nprintf '%s\\n' "$*" >> "${log}"\nexit ${exitCode}\n`,
  );
  chmodSync(cargo, 0o755);
  const env = { ...process.env, PATH: `${dir}${delimiter}${process.env.PATH}`, CARGO: cargo, CARGO_TARGET_DIR: join(dir, "target") };
  for (const name of ["ONCE_COMPONENT", "ONCE_BIN", "ONCE_REFUND_SERVICE", "ONCE_EMBED"]) delete env[name];
  const r = spawnSync(process.execPath, [join(JS, "scripts", script)], { cwd: JS, env, encoding: "utf8" });
  const commands = existsSync(log) ? readFileSync(log, "utf8").trim().split("\n") : [];
  return { status: r.status, output: `${r.stdout}${r.stderr}`, commands };
}

test("npm run build asks cargo for the guest component alone, for wasm32-wasip2: no host crate, no wasmtime", (t) => {
  const { status, output, commands } = withStandInCargo(t, "build.mjs", 3);
  assert.notEqual(status, 0, "the stand-in cargo failed, so the build must stop");
  assert.equal(commands.length, 1, output);
  const args = commands[0].split(" ");
  assert.equal(args[0], "build");
  assert.deepEqual(args.filter((_, i) => args[i - 1] === "-p"), ["once-guest"], commands[0]);
  assert.ok(args.includes("--lib") && args[args.indexOf("--target") + 1] === "wasm32-wasip2", commands[0]);
  // And that package, for that target, does not depend on wasmtime (the real cargo, offline: the lock file's crates).
  const tree = execFileSync(
    process.env.CARGO ?? "cargo",
    ["tree", "--locked", "--offline", "-p", "once-guest", "--target", "wasm32-wasip2", "-e", "normal,build", "--prefix", "none"],
    { cwd: REPO, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] },
  );
  assert.match(tree, /^once-guest /m);
  assert.doesNotMatch(tree, /^wasmtime/m);
});

test("npm test's pretest builds the repository binaries the tests drive when they are not there", (t) => {
  const pkg = JSON.parse(readFileSync(join(JS, "package.json"), "utf8"));
  assert.equal(pkg.scripts.pretest, "node scripts/pretest.mjs");
  const { status, output, commands } = withStandInCargo(t, "pretest.mjs", 0);
  // The stand-in built nothing, so the pretest stops and names what is missing.
  assert.notEqual(status, 0);
  assert.match(output, /cargo succeeded but .*debug.once is missing/);
  assert.deepEqual(commands, ["build --locked -p once-cli -p once-refund-example --bins", "build --locked -p once-host --example embed"]);
});
