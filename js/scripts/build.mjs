// `npm run build`: the guest component transpiled by the pinned jco into gen/, then the TypeScript into dist/
// (and the repository LICENSE copied in, for npm pack).
//
// The component is $ONCE_COMPONENT when set; else the one cargo builds for the
// host library (target/once-guest/wasm32-wasip2/release/once_guest.wasm under
// $CARGO_TARGET_DIR or the repository's target/), built first with
// `cargo build -p once-host` when missing or older than the guest's sources.
import { execFileSync } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const HERE = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const REPO = resolve(HERE, "..");

function newest(path) {
  const s = statSync(path);
  if (!s.isDirectory()) return s.mtimeMs;
  return Math.max(s.mtimeMs, ...readdirSync(path).map((name) => newest(join(path, name))));
}

function component() {
  if (process.env.ONCE_COMPONENT) {
    const given = resolve(process.env.ONCE_COMPONENT);
    if (!existsSync(given)) throw new Error(`ONCE_COMPONENT=${given}: no such file`);
    return given;
  }
  const target = resolve(process.env.CARGO_TARGET_DIR ?? join(REPO, "target"));
  const wasm = join(target, "once-guest", "wasm32-wasip2", "release", "once_guest.wasm");
  const sources = Math.max(newest(join(REPO, "guest")), newest(join(REPO, "wit")));
  if (!existsSync(wasm) || statSync(wasm).mtimeMs < sources) {
    console.log(`build: ${wasm} is missing or stale; cargo build -p once-host`);
    execFileSync("cargo", ["build", "-p", "once-host", "--locked"], { cwd: REPO, stdio: "inherit" });
  }
  if (!existsSync(wasm)) throw new Error(`cargo built no component at ${wasm}`);
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
// npm packs only what is under js/: the repository's LICENSE is copied in, a build product like dist/.
copyFileSync(join(REPO, "LICENSE"), join(HERE, "LICENSE"));
// The study (not part of the package) imports the package by its name.
rmSync(join(HERE, "dist-study"), { recursive: true, force: true });
execFileSync(process.execPath, [tsc, "-p", join(HERE, "study", "tsconfig.json")], { stdio: "inherit" });
console.log("build: dist-study/ compiled");
