// `npm run build`: the guest component transpiled by the pinned jco into gen/, then the TypeScript into dist/
// (and the repository LICENSE and schema/ copied in, for npm pack).
//
// The component is, and the build says which:
// - $ONCE_COMPONENT when set: a built once_guest.wasm, used as given (nothing is compiled, no
//   freshness check: the file named is the file shipped);
// - else the guest alone, built by cargo for wasm32-wasip2 with the flags and target directory of
//   host/once/build.rs and python/hatch_build.py (so every host ships the same bytes):
//   `cargo build --locked --release -p once-guest --lib --target wasm32-wasip2 --target-dir <target>/once-guest`.
//   Cargo decides freshness (a no-op when the guest is up to date); no wasmtime, no host crate.
//   It needs cargo and the target (`rustup target add wasm32-wasip2`); without them the build stops
//   and says so, never falling back to a .wasm that happens to lie in target/.
import { execFileSync, spawnSync } from "node:child_process";
import { copyFileSync, cpSync, existsSync, mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const HERE = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const REPO = resolve(HERE, "..");
const TARGET = "wasm32-wasip2";
// The release profile host/once/build.rs builds the guest with.
const PROFILE = {
  CARGO_PROFILE_RELEASE_DEBUG: "false",
  CARGO_PROFILE_RELEASE_STRIP: "true",
  CARGO_PROFILE_RELEASE_LTO: "true",
  CARGO_PROFILE_RELEASE_CODEGEN_UNITS: "1",
  CARGO_PROFILE_RELEASE_OPT_LEVEL: "3",
  CARGO_PROFILE_RELEASE_PANIC: "abort",
};
// Flags meant for a host build must not leak into the wasm build (as in host/once/build.rs).
const HOST_ONLY = ["RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS", "RUSTC_WORKSPACE_WRAPPER", "CARGO_BUILD_TARGET", "CARGO_TARGET_DIR", "CARGO_BUILD_RUSTFLAGS"];

function fail(message) {
  console.error(`build: ${message}`);
  process.exit(1);
}

function component() {
  if (process.env.ONCE_COMPONENT) {
    const given = resolve(process.env.ONCE_COMPONENT);
    if (!existsSync(given) || !statSync(given).isFile()) fail(`ONCE_COMPONENT=${given}: no such file`);
    console.log(`build: the component is ONCE_COMPONENT=${given}, used as given (not rebuilt)`);
    return given;
  }
  if (!existsSync(join(REPO, "Cargo.toml")) || !existsSync(join(REPO, "guest", "Cargo.toml"))) {
    fail(`no once repository at ${REPO} to build the guest from: set ONCE_COMPONENT to a built once_guest.wasm`);
  }
  const cargo = process.env.CARGO ?? "cargo";
  const found = spawnSync(cargo, ["--version"], { stdio: "ignore" });
  if (found.error || found.status !== 0) {
    fail(`${cargo} is not on PATH: building the guest component needs Rust (https://rustup.rs) and its ${TARGET} ` +
      `target (rustup target add ${TARGET}); or set ONCE_COMPONENT to a built once_guest.wasm`);
  }
  const sysroot = spawnSync(process.env.RUSTC ?? "rustc", ["--print", "sysroot"], { cwd: REPO, encoding: "utf8" });
  if (sysroot.status === 0 && !existsSync(join(sysroot.stdout.trim(), "lib", "rustlib", TARGET, "lib"))) {
    fail(`the ${TARGET} target is missing: rustup target add ${TARGET}`);
  }
  const targetDir = join(resolve(process.env.CARGO_TARGET_DIR ?? join(REPO, "target")), "once-guest");
  const args = ["build", "--locked", "--release", "-p", "once-guest", "--lib", "--target", TARGET, "--target-dir", targetDir];
  const env = { ...process.env, ...PROFILE };
  for (const name of HOST_ONLY) delete env[name];
  console.log(`build: the guest component: ${cargo} ${args.join(" ")}`);
  const built = spawnSync(cargo, args, { cwd: REPO, env, stdio: "inherit" });
  if (built.error || built.status !== 0) fail(`building the guest component failed (${built.error ?? `exit ${built.status}`})`);
  const wasm = join(targetDir, TARGET, "release", "once_guest.wasm");
  if (!existsSync(wasm)) fail(`cargo succeeded but ${wasm} is missing`);
  return wasm;
}

// jco's generated `_debugLog` reads process.env.JCO_DEBUG on every call (process.env is a
// C++ lookup in Node), and the bindings call it many times per export call: about 12% of a warm
// protected call's time in Node (BENCHMARKS.md, "Node.js"). Read the variable once, at
// load, instead; JCO_DEBUG still turns the log on. The pinned jco writes the check once;
// any other output stops the build rather than going unpatched.
function quietDebugLog(file) {
  const check = "if (!globalThis?.process?.env?.JCO_DEBUG) { return; }";
  const text = readFileSync(file, "utf8");
  const found = text.split(check).length - 1;
  if (found !== 1) throw new Error(`build: expected jco's debug-log check once in ${file}, found it ${found} times`);
  const once = "const JCO_DEBUG_AT_LOAD = Boolean(globalThis?.process?.env?.JCO_DEBUG);\n";
  const patched = text.replace(check, "if (!JCO_DEBUG_AT_LOAD) { return; }");
  // After the module's directive prologue (jco starts it with "use components";).
  const body = patched.indexOf("\nexport ");
  writeFileSync(file, patched.slice(0, body + 1) + once + patched.slice(body + 1));
}

const wasm = component();
const gen = join(HERE, "gen");
rmSync(gen, { recursive: true, force: true });
mkdirSync(gen, { recursive: true });
const jco = join(HERE, "node_modules", "@bytecodealliance", "jco", "dist", "jco.js");
execFileSync(process.execPath, [jco, "transpile", wasm, "-o", gen, "--name", "once", "--instantiation", "sync", "--quiet"], {
  stdio: "inherit",
});
quietDebugLog(join(gen, "once.js"));
writeFileSync(join(gen, "package.json"), '{"type":"module"}\n');
console.log(`build: ${wasm} transpiled into gen/`);
rmSync(join(HERE, "dist"), { recursive: true, force: true });
const tsc = join(HERE, "node_modules", "typescript", "bin", "tsc");
execFileSync(process.execPath, [tsc, "-p", join(HERE, "tsconfig.json")], { stdio: "inherit" });
console.log("build: dist/ compiled");
// npm packs only what is under js/: the repository's LICENSE is copied in, a build product like dist/,
// and so is the ledger's DDL, schema/ (read by dist/stores/schema.js relative to itself).
copyFileSync(join(REPO, "LICENSE"), join(HERE, "LICENSE"));
rmSync(join(HERE, "schema"), { recursive: true, force: true });
cpSync(join(REPO, "schema"), join(HERE, "schema"), { recursive: true });
console.log("build: schema/ copied");
// The study (not part of the package) imports the package by its name.
rmSync(join(HERE, "dist-study"), { recursive: true, force: true });
execFileSync(process.execPath, [tsc, "-p", join(HERE, "study", "tsconfig.json")], { stdio: "inherit" });
console.log("build: dist-study/ compiled");
