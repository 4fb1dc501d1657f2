// `npm test` runs this first (the `pretest` script): the repository binaries the tests drive, which
// `npm run build` does not make:
//   once            the CLI (ONCE_BIN)                 cargo build -p once-cli
//   refund-service  the study's service (ONCE_REFUND_SERVICE)  cargo build -p once-refund-example
//   examples/embed  the Rust embedding (ONCE_EMBED)     cargo build -p once-host --example embed
// A binary named by its variable is used as given (it must exist). The others are built here with
// the same two cargo commands as .ci/run's python stage, so under CI they are already fresh (cargo
// checks in seconds); on a fresh clone the first `npm test` builds them (the CLI links wasmtime: minutes).
// Without cargo, and with a binary neither named nor buildable, this stops `npm test` with what to do.
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const TARGET = resolve(process.env.CARGO_TARGET_DIR ?? join(REPO, "target"));

const BINARIES = [
  { env: "ONCE_BIN", path: join("debug", "once"), build: ["build", "--locked", "-p", "once-cli", "-p", "once-refund-example", "--bins"] },
  { env: "ONCE_REFUND_SERVICE", path: join("debug", "refund-service"), build: ["build", "--locked", "-p", "once-cli", "-p", "once-refund-example", "--bins"] },
  { env: "ONCE_EMBED", path: join("debug", "examples", "embed"), build: ["build", "--locked", "-p", "once-host", "--example", "embed"] },
];

function fail(message) {
  console.error(`pretest: ${message}`);
  process.exit(1);
}

const commands = new Map();
for (const b of BINARIES) {
  const given = process.env[b.env];
  if (given) {
    if (!existsSync(given)) fail(`${b.env}=${given}: no such file`);
    console.log(`pretest: ${b.env}=${given}, used as given`);
    continue;
  }
  commands.set(b.build.join(" "), b);
}
if (commands.size > 0) {
  const cargo = process.env.CARGO ?? "cargo";
  const found = spawnSync(cargo, ["--version"], { stdio: "ignore" });
  if (found.error || found.status !== 0) {
    const names = BINARIES.filter((b) => !process.env[b.env]).map((b) => b.env).join(", ");
    fail(`${cargo} is not on PATH: the tests drive the repository's binaries; install Rust (https://rustup.rs) to build them, or set ${names}`);
  }
  for (const [args] of commands) {
    console.log(`pretest: ${cargo} ${args}`);
    const r = spawnSync(cargo, args.split(" "), { cwd: REPO, stdio: "inherit" });
    if (r.error || r.status !== 0) fail(`${cargo} ${args} failed (${r.error ?? `exit ${r.status}`})`);
  }
  for (const b of BINARIES) {
    if (!process.env[b.env] && !existsSync(join(TARGET, b.path))) fail(`cargo succeeded but ${join(TARGET, b.path)} is missing`);
  }
}
