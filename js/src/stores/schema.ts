// The ledger's DDL: the once repository's `schema/` files, which `npm run build` copies into the package
// (`schema/`, in the tarball) and this module reads relative to itself. The Rust host includes the same
// files and the Python package ships them, so every host creates and upgrades a ledger with the same
// statements. How a ledger applies them is schema/README.md (shipped beside them); this is that rule, as
// host/once/src/storage/ddl.rs is for Rust.
import { readFileSync, readdirSync } from "node:fs";
import { fileURLToPath } from "node:url";

const SCHEMA_DIR = new URL("../../schema/", import.meta.url);
const STEP = /^(\d{3})-[a-z0-9-]+\.sql$/;

/** What one migration runs: the version it brings the ledger to, whether it is the new-ledger layout, the SQL. */
export interface Step {
  version: number;
  fresh: boolean;
  sql: string;
}

/** One backend's files: `000-*.sql` (run first), `ledger.sql` (a new ledger's layout), the numbered steps. */
export interface Migrations {
  bootstrap?: string;
  fresh?: string;
  /** [NNN, text], ascending: each takes a ledger from version NNN - 1 to NNN. */
  steps: [number, string][];
}

const loaded = new Map<string, Migrations>();

/** The SQLite witness file's table (`schema/witness/sqlite.sql`), as every host creates it. */
export function witnessTable(): string {
  const file = new URL("witness/sqlite.sql", SCHEMA_DIR);
  try {
    return readFileSync(file, "utf8");
  } catch (e) {
    throw new Error(`witness: this package ships no schema file (${fileURLToPath(file)}): ${(e as Error).message}; reinstall once-exactly`);
  }
}

/** The files of `schema/<backend>` this package ships (`sqlite` or `postgres`). */
export function migrations(backend: "sqlite" | "postgres"): Migrations {
  const known = loaded.get(backend);
  if (known) return known;
  const dir = new URL(`${backend}/`, SCHEMA_DIR);
  let names: string[];
  try {
    names = readdirSync(dir).filter((n) => n.endsWith(".sql")).sort();
  } catch (e) {
    throw new Error(`${backend}: this package ships no schema files (${fileURLToPath(dir)}): ${(e as Error).message}; reinstall once-exactly`);
  }
  const files: Migrations = { steps: [] };
  for (const name of names) {
    const sql = readFileSync(new URL(name, dir), "utf8");
    const step = STEP.exec(name);
    if (name === "ledger.sql") files.fresh = sql;
    else if (step && Number(step[1]) === 0) files.bootstrap = sql;
    else if (step) files.steps.push([Number(step[1]), sql]);
    else throw new Error(`${backend}: unexpected schema file ${fileURLToPath(new URL(name, dir))}`);
  }
  files.steps.sort((a, b) => a[0] - b[0]);
  loaded.set(backend, files);
  return files;
}

/** The version the files bring a ledger to: the highest step's. */
export function current(files: Migrations): number {
  return files.steps.length ? files.steps[files.steps.length - 1][0] : 0;
}

/**
 * What a ledger recorded at `found` runs, in order (the bootstrap apart): a new ledger the fresh layout if
 * there is one, else every step; any other the steps above `found`.
 */
export function plan(files: Migrations, found: number): Step[] {
  if (found === 0 && files.fresh !== undefined) return [{ version: current(files), fresh: true, sql: files.fresh }];
  return files.steps.filter(([n]) => n > found).map(([version, sql]) => ({ version, fresh: false, sql }));
}

/** A `postgres/` file's text for one schema: every `{schema}` replaced by its quoted identifier. */
export function forSchema(sql: string, quoted: string): string {
  return sql.replaceAll("{schema}", quoted);
}
