// What the tests share: the repository's binaries (env first, then target/debug), temp dirs, child processes.
import { execFileSync, spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const JS = resolve(dirname(fileURLToPath(import.meta.url)), "..");
export const REPO = resolve(JS, "..");
const TARGET = resolve(process.env.CARGO_TARGET_DIR ?? join(REPO, "target"));

/** A binary the tests need: $ENV, else <target>/debug/<name>; a clear failure when neither exists. */
export function binary(env, name, build) {
  const path = process.env[env] ?? join(TARGET, "debug", name);
  if (!existsSync(path)) throw new Error(`${path} is missing: build it (${build}) or set ${env}`);
  return path;
}

export const onceBin = () => binary("ONCE_BIN", "once", "cargo build -p once-cli");

/** Run the `once` CLI; its stdout. */
export function once(...args) {
  return execFileSync(onceBin(), args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
}

/** A fresh temp dir, removed after the test. */
export function tempDir(t) {
  const dir = mkdtempSync(join(tmpdir(), "once-js-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** Start a Node child running `script` (a file in test/children); resolves with {code, signal, stdout, stderr} when it ends. */
export function child(script, args, options = {}) {
  const proc = spawn(process.execPath, [join(JS, "test", "children", script), ...args], {
    stdio: ["ignore", "pipe", "pipe"],
    ...options,
  });
  let stdout = "";
  let stderr = "";
  proc.stdout.on("data", (d) => (stdout += d));
  proc.stderr.on("data", (d) => (stderr += d));
  const done = new Promise((res) => proc.on("exit", (code, signal) => res({ code, signal, stdout, stderr })));
  return { proc, done, out: () => stdout };
}

/** The PostgreSQL URL of the tests, or undefined (a skip with a notice; with CI set, a failure). */
export function databaseUrl(t) {
  const url = process.env.ONCE_TEST_DATABASE_URL;
  if (url) return url;
  if (process.env.CI) throw new Error("ONCE_TEST_DATABASE_URL is not set and CI is: PostgreSQL tests must run");
  t.skip("skipped: no database (set ONCE_TEST_DATABASE_URL)");
  return undefined;
}

/** A Python with the once-exactly package installed ($ONCE_PYTHON); a skip with a notice, or under CI a failure. */
export function python(t) {
  const path = process.env.ONCE_PYTHON;
  if (path && existsSync(path)) return path;
  const why = `ONCE_PYTHON ${path ? `(${path}) does not exist` : "is not set"}: a Python with the package installed (pip install ./python)`;
  if (process.env.CI) throw new Error(`${why}; with CI set, the Python crossing must run`);
  t.skip(`skipped: ${why}`);
  return undefined;
}

/** A schema name of its own for one test, dropped after it. */
export async function schemaFor(t, url) {
  const pg = (await import("pg")).default;
  const schema = `once_js_${process.pid}_${Math.floor(Math.random() * 1e9)}`;
  t.after(async () => {
    const c = new pg.Client({ connectionString: url });
    await c.connect();
    await c.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
    await c.end();
  });
  return schema;
}

export const withSchema = (url, schema) => `${url}${url.includes("?") ? "&" : "?"}schema=${schema}`;

export { execFileSync };
