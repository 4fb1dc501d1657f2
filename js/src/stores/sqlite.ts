// The SQLite ledger, in the Rust host's format (host/once/src/storage/sqlite):
// the same tables, columns, indexes and schema version (made by the same files, the repository's
// schema/sqlite, shipped in the package), WAL mode, one
// BEGIN IMMEDIATE transaction per batch. `once ledger list/show/resolve --db`
// reads a file written here, and a Rust host and this one can share it.
//
// Durability (DESIGN.md "Durability budget"): `full` (the default) commits
// every batch at `PRAGMA synchronous = FULL`, `normal` every one at NORMAL;
// `intent-only` commits the batches the engine marks deferrable (an attempt's
// own success, a replay or conflict count) at NORMAL and every other one (an
// intent, a rejection, an unknown, an operator's resolution) at FULL. NORMAL in
// WAL mode skips the fsync, not the write: a process crash loses nothing; a
// power loss may lose the deferred commits after the last FULL one, which a
// later read restores (a lost success: the lease ends, the record goes unknown
// and reconciliation finds the effect).
//
// The witness (wit/once.wit `witness`; docs/design.md "Older history") lives in
// a file of its own beside the ledger, `<ledger>.witness`, so that copying an
// older backup over the ledger file leaves it as it was: the engine then finds
// there what the restored ledger lost. Its table is the Rust and Python hosts'
// too (any of them may open the same file), and every keep is synced (FULL)
// before it answers, whatever the ledger's own mode: a grant leaves the engine
// only after its record is kept.
import type Database from "better-sqlite3";
import type { AuditEvent, Batch, Put, Row, State, Table } from "../wit.js";
import { loadOptional } from "./optional.js";
import { migrations, plan, witnessTable } from "./schema.js";
import {
  BODY_FORMAT_KEY,
  type CommitVerdict,
  type Counts,
  I64_MAX,
  SYNCHRONOUS_LEVELS,
  type Synchronous,
  type SyncStore,
  int,
  nextBodyFormat,
  synchronousMode,
} from "./store.js";

export { type Synchronous, synchronousMode };

/** The schema version this code writes and understands (the Rust host's `SCHEMA_VERSION`): the highest step of schema/sqlite. */
export const SCHEMA_VERSION = 2;

/** The file the witness of the SQLite ledger at `ledger` lives in: the ledger's path and `.witness`. */
export const witnessPath = (ledger: string): string => `${ledger}.witness`;

/** Where and how to open an SQLite ledger. */
export interface SqliteOptions {
  /** The ledger file, created if missing. */
  path: string;
  /** How durable each commit is; default `full`. */
  synchronous?: Synchronous;
  /** How long a commit waits for another writer (any process), in ms; default 5000. */
  busyTimeoutMs?: number;
}

const ROW_COLUMNS = "tbl, scope, key, version, state, due_at, body, owner";
const EVENT_COLUMNS = "scope, key, version, at, kind, from_state, to_state, attempt, detail";
const TABLES = new Set(["operation", "tombstone", "quota"]);
const STATES = new Set(["in-flight", "confirmed", "failed", "unknown", "absent", "superseded", "awaiting-approval", "denied"]);

type RawRow = {
  tbl: string;
  scope: string;
  key: string;
  version: bigint;
  state: string | null;
  due_at: bigint | null;
  body: string;
  owner: string | null;
};
type RawEvent = {
  scope: string;
  key: string;
  version: bigint;
  at: bigint;
  kind: string;
  from_state: string | null;
  to_state: string | null;
  attempt: bigint | null;
  detail: string;
};

class Conflict extends Error {}

/** An SQLite ledger file shared by threads and processes (SQLite's file locks arbitrate), and its witness file. */
export class SqliteStore implements SyncStore {
  private db: Database.Database;
  private q;
  /** The witness file's connection (`witnessPath`), and its statements. */
  private witnessDb: Database.Database;
  private w;
  private readonly witnessAt: string;
  private readonly at: string;
  /** The `PRAGMA synchronous` of an ordinary commit and of a deferrable one. */
  private readonly levels: readonly [string, string];
  /** The connection's `PRAGMA synchronous` now. */
  private level: string;

  constructor(options: SqliteOptions) {
    this.at = options.path;
    this.witnessAt = witnessPath(options.path);
    this.levels = SYNCHRONOUS_LEVELS[synchronousMode(options.synchronous ?? "full")];
    this.level = this.levels[0];
    // Loaded here, not at import: the worker of a memory ledger never needs the native module.
    const Sqlite = loadOptional<typeof Database>("better-sqlite3", `sqlite: the SQLite ledger ${this.at}`);
    const timeout = options.busyTimeoutMs ?? 5000;
    try {
      this.db = new Sqlite(options.path, { timeout });
      this.db.pragma(`synchronous = ${this.level}`);
    } catch (e) {
      throw new Error(`sqlite: open ${this.at}: ${(e as Error).message}`);
    }
    enableWal(this.db, this.at, timeout);
    this.initSchema();
    // Opened with the ledger, not at the first grant: a ledger whose witness cannot be kept is refused
    // when it is opened (a StorageError naming the file), before any call relies on it.
    let witnessDb: Database.Database | undefined;
    try {
      witnessDb = new Sqlite(this.witnessAt, { timeout });
      witnessDb.pragma("synchronous = FULL");
      enableWal(witnessDb, this.witnessAt, timeout);
      witnessDb.exec(witnessTable());
    } catch (e) {
      witnessDb?.close();
      this.db.close();
      throw new Error(`sqlite: open the witness ${this.witnessAt}: ${(e as Error).message}`);
    }
    this.witnessDb = witnessDb;
    const witness = (sql: string) => this.witnessDb.prepare(sql).safeIntegers(true);
    this.w = {
      seen: witness("SELECT body FROM witness WHERE scope = ? AND key = ?"),
      // Never replaces what a later grant kept (two hosts racing, or a slow keep overtaken).
      keep: witness(
        "INSERT INTO witness (scope, key, at, body) VALUES (?, ?, ?, ?) " +
          "ON CONFLICT (scope, key) DO UPDATE SET at = excluded.at, body = excluded.body WHERE excluded.at >= witness.at",
      ),
      forget: witness("DELETE FROM witness WHERE scope = ? AND key = ? AND at < ?"),
    };
    const prepare = (sql: string) => this.db.prepare(sql).safeIntegers(true);
    this.q = {
      get: prepare(`SELECT ${ROW_COLUMNS} FROM rows WHERE tbl = ? AND scope = ? AND key = ?`),
      insert: prepare(
        "INSERT INTO rows (tbl, scope, key, version, state, due_at, body, owner) VALUES (?, ?, ?, ?, ?, ?, ?, ?) " +
          "ON CONFLICT DO NOTHING",
      ),
      update: prepare(
        "UPDATE rows SET version = ?, state = ?, due_at = ?, body = ?, owner = ? " +
          "WHERE tbl = ? AND scope = ? AND key = ? AND version = ?",
      ),
      del: prepare("DELETE FROM rows WHERE tbl = ? AND scope = ? AND key = ? AND version = ?"),
      exists: prepare("SELECT EXISTS (SELECT 1 FROM rows WHERE tbl = ? AND scope = ? AND key = ?) AS e"),
      event: prepare(
        `INSERT INTO audit (${EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
      ),
      audit: prepare(`SELECT ${EVENT_COLUMNS} FROM audit WHERE scope = ? AND key = ? ORDER BY version`),
      // States as one JSON array parameter keeps the statement cacheable (as the Rust store does).
      scan: prepare(
        `SELECT ${ROW_COLUMNS} FROM rows WHERE tbl = ? AND due_at IS NOT NULL AND due_at <= ? ` +
          "AND (? IS NULL OR state IN (SELECT value FROM json_each(?))) AND (? IS NULL OR owner = ?) " +
          "ORDER BY due_at, scope, key LIMIT ?",
      ),
    };
  }

  /** Check the schema version, then create what is missing, in one write transaction (as the Rust host does). */
  private initSchema(): void {
    const db = this.db;
    db.exec("BEGIN IMMEDIATE");
    try {
      const files = migrations("sqlite");
      if (files.bootstrap !== undefined) db.exec(files.bootstrap);
      const hasMeta = db.prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").get() !== undefined;
      const found = hasMeta
        ? (db.prepare("SELECT value FROM meta WHERE key = 'schema_version'").get() as { value: string } | undefined)?.value
        : undefined;
      if (found !== undefined) {
        const version = Number(found);
        if (!Number.isInteger(version)) throw new Error(`sqlite: unreadable schema version ${JSON.stringify(found)}`);
        if (version > SCHEMA_VERSION) {
          throw new Error(
            `sqlite: schema version ${version} is newer than this build understands (${SCHEMA_VERSION}); upgrade once`,
          );
        }
      }
      // The package's schema/sqlite files: a new file's whole layout, or the steps above its version.
      for (const step of plan(files, found === undefined ? 0 : Number(found))) db.exec(step.sql);
      if (found !== String(SCHEMA_VERSION)) {
        db.prepare(
          "INSERT INTO meta (key, value) VALUES ('schema_version', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        ).run(String(SCHEMA_VERSION));
      }
      db.exec("COMMIT");
    } catch (e) {
      if (db.inTransaction) db.exec("ROLLBACK");
      throw new Error(`${(e as Error).message} (${this.at})`);
    }
  }

  claimBodyFormat(format: number): void {
    const db = this.db;
    const read = () => (db.prepare("SELECT value FROM meta WHERE key = ?").get(BODY_FORMAT_KEY) as { value: string } | undefined)?.value;
    if (nextBodyFormat(this.at, read(), format) === undefined) return;
    db.exec("BEGIN IMMEDIATE");
    try {
      // Read again under the write lock: another process may have raised it meanwhile.
      const next = nextBodyFormat(this.at, read(), format);
      if (next !== undefined) {
        db.prepare("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value").run(
          BODY_FORMAT_KEY,
          String(next),
        );
      }
      db.exec("COMMIT");
    } catch (e) {
      if (db.inTransaction) db.exec("ROLLBACK");
      throw e;
    }
  }

  private row(r: RawRow | undefined): Row | undefined {
    if (r === undefined) return undefined;
    if (!TABLES.has(r.tbl)) throw new Error(`sqlite: unknown table ${JSON.stringify(r.tbl)} in file`);
    if (r.state !== null && !STATES.has(r.state)) throw new Error(`sqlite: unknown state ${JSON.stringify(r.state)} in file`);
    if (r.version < 0n || (r.due_at !== null && r.due_at < 0n)) throw new Error("sqlite: negative integer in file");
    return {
      table: r.tbl as Table,
      scope: r.scope,
      key: r.key,
      version: r.version,
      state: (r.state ?? undefined) as State | undefined,
      dueAt: r.due_at ?? undefined,
      owner: r.owner ?? undefined,
      body: r.body,
    };
  }

  get(table: Table, scope: string, key: string): Row | undefined {
    return this.row(this.q.get.get(table, scope, key) as RawRow | undefined);
  }

  private put(p: Put): void {
    const q = this.q;
    const r = p.row;
    let changed: number;
    if (p.expected === undefined && r) {
      changed = q.insert.run(p.table, p.scope, p.key, int("sqlite", "version", r.version), r.state ?? null,
        r.dueAt === undefined ? null : int("sqlite", "due_at", r.dueAt), r.body, r.owner ?? null).changes;
    } else if (r) {
      changed = q.update.run(int("sqlite", "version", r.version), r.state ?? null,
        r.dueAt === undefined ? null : int("sqlite", "due_at", r.dueAt), r.body, r.owner ?? null,
        p.table, p.scope, p.key, int("sqlite", "expected version", p.expected!)).changes;
    } else if (p.expected !== undefined) {
      changed = q.del.run(p.table, p.scope, p.key, int("sqlite", "expected version", p.expected)).changes;
    } else {
      // "Must not exist, and stays absent": a pure check.
      changed = (q.exists.get(p.table, p.scope, p.key) as { e: bigint }).e === 0n ? 1 : 0;
    }
    if (changed !== 1) throw new Conflict();
  }

  private event(e: AuditEvent): void {
    const n = this.q.event.run(e.scope, e.key, int("sqlite", "audit version", e.version), int("sqlite", "audit at", e.at),
      e.kind, e.fromState ?? null, e.toState ?? null, e.attempt ?? null, e.detail).changes;
    if (n !== 1) throw new Conflict();
  }

  commit(batch: Batch): CommitVerdict {
    const db = this.db;
    const level = this.levels[batch.deferrable ? 1 : 0];
    if (level !== this.level) {
      // Outside any transaction, so it governs the COMMIT below.
      try {
        db.pragma(`synchronous = ${level}`);
      } catch (e) {
        return { tag: "failed", val: { message: `sqlite: ${this.at}: set synchronous = ${level}: ${(e as Error).message}` } };
      }
      this.level = level;
    }
    try {
      db.exec("BEGIN IMMEDIATE");
    } catch (e) {
      return { tag: "failed", val: { message: `sqlite: ${this.at}: begin: ${(e as Error).message}` } };
    }
    try {
      for (const p of batch.puts) this.put(p);
      for (const e of batch.events) this.event(e);
    } catch (e) {
      db.exec("ROLLBACK");
      if (e instanceof Conflict) return { tag: "conflict" };
      return { tag: "failed", val: { message: `sqlite: ${this.at}: ${(e as Error).message}` } };
    }
    try {
      db.exec("COMMIT");
      return { tag: "applied" };
    } catch (e) {
      if (db.inTransaction) db.exec("ROLLBACK");
      return { tag: "failed", val: { message: `sqlite: ${this.at}: commit: ${(e as Error).message}` } };
    }
  }

  scan(table: Table, states: State[], dueBefore: bigint, owner: string | undefined, limit: number): Row[] {
    const names = states.length === 0 ? null : JSON.stringify(states);
    const bound = dueBefore > I64_MAX ? I64_MAX : dueBefore;
    const o = owner ?? null;
    return (this.q.scan.all(table, bound, names, names, o, o, limit) as RawRow[]).map((r) => this.row(r)!);
  }

  audit(scope: string, key: string): AuditEvent[] {
    return (this.q.audit.all(scope, key) as RawEvent[]).map((e) => ({
      scope: e.scope,
      key: e.key,
      version: e.version,
      at: e.at,
      kind: e.kind,
      fromState: (e.from_state ?? undefined) as State | undefined,
      toState: (e.to_state ?? undefined) as State | undefined,
      attempt: e.attempt === null ? undefined : Number(e.attempt),
      detail: e.detail,
    }));
  }

  counts(): Counts {
    const n: Counts = { operation: 0, tombstone: 0, quota: 0, events: 0 };
    for (const r of this.db.prepare("SELECT tbl, count(*) AS n FROM rows GROUP BY tbl").all() as { tbl: Table; n: number }[]) {
      n[r.tbl] = r.n;
    }
    n.events = (this.db.prepare("SELECT count(*) AS n FROM audit").get() as { n: number }).n;
    return n;
  }

  witnessSeen(scope: string, key: string): string | undefined {
    let found: { body: unknown } | undefined;
    try {
      found = this.w.seen.get(scope, key) as { body: unknown } | undefined;
    } catch (e) {
      throw new Error(`sqlite: witness ${this.witnessAt}: ${(e as Error).message}`);
    }
    if (found === undefined) return undefined;
    // SQLite keeps any type in any column: a body another writer left as a blob or a number is no record.
    if (typeof found.body !== "string") {
      throw new Error(`sqlite: witness ${this.witnessAt}: the body kept for ${JSON.stringify([scope, key])} is not text`);
    }
    return found.body;
  }

  witnessKeep(scope: string, key: string, body: string, at: bigint): void {
    const when = int("sqlite", "witness at", at);
    try {
      // One statement, so its own transaction, committed at synchronous = FULL: on disk when run returns.
      this.w.keep.run(scope, key, when, body);
    } catch (e) {
      throw new Error(`sqlite: witness ${this.witnessAt}: ${(e as Error).message}`);
    }
  }

  witnessForget(scope: string, key: string, before: bigint): void {
    try {
      // Every `at` a file holds is at most i64::MAX, so a later `before` is that.
      this.w.forget.run(scope, key, before > I64_MAX ? I64_MAX : before);
    } catch (e) {
      throw new Error(`sqlite: witness ${this.witnessAt}: ${(e as Error).message}`);
    }
  }

  close(): void {
    this.witnessDb.close();
    this.db.close();
  }
}

/** WAL mode; switching does not wait on SQLite's busy handler, so a file being created by several processes is retried. */
function enableWal(db: Database.Database, at: string, timeoutMs: number): void {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      const mode = String(db.pragma("journal_mode = WAL", { simple: true }));
      if (mode.toLowerCase() !== "wal") throw new Error(`sqlite: ${at}: WAL journal mode unavailable (got ${mode})`);
      return;
    } catch (e) {
      const code = (e as { code?: string }).code;
      if ((code === "SQLITE_BUSY" || code === "SQLITE_LOCKED") && Date.now() < deadline) {
        Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 5);
        continue;
      }
      throw e;
    }
  }
}
