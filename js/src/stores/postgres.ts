// The PostgreSQL ledger, in the Rust host's format (host/once/src/storage/postgres):
// the same schema (created or migrated under the same advisory lock, by the same files: the
// repository's schema/postgres, shipped in the package), the same
// statements, one READ COMMITTED transaction per batch with its puts in row
// order, and the database's clock as the ledger clock. It runs on the main
// thread (the `pg` client is asynchronous); the engine's worker asks it.
//
// It keeps no witness (wit/once.wit `witness`): the worker's side of it answers
// "nothing kept" (worker.ts, `RemoteStore`). A witness in the same database
// would be restored with it; this host is told of no other place. So a
// PostgreSQL ledger restored from an older backup is not detected
// (docs/design.md "Older history").
import type pg from "pg";
import type { AuditEvent, Batch, Row, State, Table } from "../wit.js";
import { loadOptional } from "./optional.js";
import { forSchema, migrations, plan } from "./schema.js";
import { BODY_FORMAT_KEY, type CommitVerdict, I64_MAX, int, nextBodyFormat, utf8cmp } from "./store.js";

/** The schema version this code writes and understands (the Rust host's): the highest step of schema/postgres. */
export const SCHEMA_VERSION = 3;

/** The schema that holds the ledger unless the URL's `schema` parameter names another. */
export const DEFAULT_SCHEMA = "once";

const ROW_COLUMNS = "tbl, scope, key, version, state, due_at, body, owner";
const TABLE_ORDER: Record<string, number> = { operation: 0, tombstone: 1, quota: 2 };
const STATES = new Set(["in-flight", "confirmed", "failed", "unknown", "absent", "superseded", "awaiting-approval", "denied"]);

const quote = (name: string) => `"${name.replace(/"/g, '""')}"`;

/** A schema name the Rust host accepts too: [a-z_][a-z0-9_]*, at most 63 bytes, not pg_…. */
export function checkSchemaName(name: string): void {
  if (!/^[a-z_][a-z0-9_]{0,62}$/.test(name) || name.startsWith("pg_")) {
    throw new Error(`postgres: schema name ${JSON.stringify(name)} is not [a-z_][a-z0-9_]* (at most 63 bytes, not pg_…)`);
  }
}

/** Split the `schema` parameter off a URL: the URL the client sees, and the schema. */
export function splitSchema(url: string): [string, string] {
  const at = url.indexOf("?");
  if (at < 0) return [url, DEFAULT_SCHEMA];
  let schema: string | undefined;
  const rest: string[] = [];
  for (const pair of url.slice(at + 1).split("&").filter(Boolean)) {
    if (pair.startsWith("schema=")) {
      if (schema !== undefined) throw new Error("postgres: the URL names `schema` twice");
      schema = pair.slice("schema=".length);
    } else rest.push(pair);
  }
  return [rest.length ? `${url.slice(0, at)}?${rest.join("&")}` : url.slice(0, at), schema ?? DEFAULT_SCHEMA];
}

function noNul(what: string, s: string): void {
  if (s.includes("\0")) throw new Error(`postgres: ${what} contains U+0000, which PostgreSQL text cannot hold`);
}

type RawRow = {
  tbl: string;
  scope: string;
  key: string;
  version: string;
  state: string | null;
  due_at: string | null;
  body: string;
  owner: string | null;
};

function cook(r: RawRow): Row {
  if (r.state !== null && !STATES.has(r.state)) throw new Error(`postgres: unknown state ${JSON.stringify(r.state)} in the ledger`);
  return {
    table: r.tbl as Table,
    scope: r.scope,
    key: r.key,
    version: BigInt(r.version),
    state: (r.state ?? undefined) as State | undefined,
    dueAt: r.due_at === null ? undefined : BigInt(r.due_at),
    owner: r.owner ?? undefined,
    body: r.body,
  };
}

const RETRYABLE = new Set(["40001", "40P01"]);
const MAX_ROLLED_BACK = 5;

class Conflict extends Error {}

/** A ledger in one PostgreSQL schema, shared by any number of processes and hosts (Rust, Python, Node). */
export class PostgresStore {
  private constructor(
    private pool: pg.Pool,
    readonly schema: string,
  ) {}

  /** Connect, then create or migrate the schema (`postgres://…[?schema=name]`, default schema `once`). */
  static async open(url: string): Promise<PostgresStore> {
    const [client, schema] = splitSchema(url);
    checkSchemaName(schema);
    // `pg` is an optional peer dependency: loaded on the first PostgreSQL ledger, never at import.
    const { Pool } = loadOptional<typeof pg>("pg", "postgres: a PostgreSQL ledger");
    const pool = new Pool({ connectionString: client, max: 4 });
    pool.on("error", () => {}); // an idle client's failure surfaces on its next use
    const store = new PostgresStore(pool, schema);
    try {
      await store.migrate();
    } catch (e) {
      await pool.end();
      throw e;
    }
    return store;
  }

  private get s(): string {
    return quote(this.schema);
  }

  private async migrate(): Promise<void> {
    const s = this.s;
    const versionSql = `SELECT value FROM ${s}.meta WHERE key = 'schema_version'`;
    const c = await this.pool.connect();
    try {
      try {
        const fast = await c.query(versionSql);
        if (fast.rows[0]?.value === String(SCHEMA_VERSION)) return;
      } catch {
        // no schema yet
      }
      await c.query("BEGIN");
      try {
        // 0x6f6e6365 is "once": the Rust host's lock class, one lock per schema.
        await c.query("SELECT pg_advisory_xact_lock(1869505381, hashtext($1))", [this.schema]);
        const files = migrations("postgres");
        if (files.bootstrap !== undefined) await c.query(forSchema(files.bootstrap, s));
        const got = await c.query(versionSql);
        const found = got.rows.length ? Number(got.rows[0].value) : 0;
        if (!Number.isInteger(found)) throw new Error(`postgres: unreadable schema version ${JSON.stringify(got.rows[0].value)}`);
        if (found > SCHEMA_VERSION) {
          throw new Error(
            `postgres: schema ${this.schema} is at version ${found}, newer than this build understands (${SCHEMA_VERSION}); upgrade once`,
          );
        }
        // The package's schema/postgres files: the steps above the recorded version.
        for (const step of plan(files, found)) await c.query(forSchema(step.sql, s));
        await c.query(
          `INSERT INTO ${s}.meta (key, value) VALUES ('schema_version', $1) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value`,
          [String(SCHEMA_VERSION)],
        );
        await c.query("COMMIT");
      } catch (e) {
        await c.query("ROLLBACK").catch(() => {});
        throw new Error(`postgres: migrate ${this.schema}: ${(e as Error).message}`);
      }
    } finally {
      c.release();
    }
  }

  /**
   * Settle the schema's body format with an engine that writes `format` (see `SyncStore.claimBodyFormat`):
   * read, and written if it must change, in one transaction under the migration lock, so hosts opening one
   * schema at once cannot both act on the old value. A schema already at `format` is only read.
   */
  async claimBodyFormat(format: number): Promise<void> {
    const s = this.s;
    const read = `SELECT value FROM ${s}.meta WHERE key = $1`;
    const c = await this.pool.connect();
    try {
      // A pg Client knows where it connected (the pool's typings leave the fields out).
      const at = c as unknown as { host: string; port: number; database: string };
      const ledger = `schema ${this.schema} on ${at.host}:${at.port}/${at.database}`;
      const stored = async () => (await c.query(read, [BODY_FORMAT_KEY])).rows[0]?.value as string | undefined;
      if (nextBodyFormat(ledger, await stored(), format) === undefined) return;
      await c.query("BEGIN");
      try {
        await c.query("SELECT pg_advisory_xact_lock(1869505381, hashtext($1))", [this.schema]);
        // Read again under the lock: another host may have raised it meanwhile.
        const next = nextBodyFormat(ledger, await stored(), format);
        if (next !== undefined) {
          await c.query(
            `INSERT INTO ${s}.meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value`,
            [BODY_FORMAT_KEY, String(next)],
          );
        }
        await c.query("COMMIT");
      } catch (e) {
        await c.query("ROLLBACK").catch(() => {});
        throw e;
      }
    } finally {
      c.release();
    }
  }

  /** The database's clock, in ms since the epoch. */
  async now(): Promise<bigint> {
    const r = await this.pool.query("SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint AS now");
    return BigInt(r.rows[0].now);
  }

  async get(table: Table, scope: string, key: string): Promise<Row | undefined> {
    noNul("scope", scope);
    noNul("key", key);
    const r = await this.pool.query(`SELECT ${ROW_COLUMNS} FROM ${this.s}.rows WHERE tbl = $1 AND scope = $2 AND key = $3`, [
      table,
      scope,
      key,
    ]);
    return r.rows.length ? cook(r.rows[0]) : undefined;
  }

  /** Apply a batch in one transaction; a deferrable one like any other (durability is the server's, as for the Rust host). */
  async commit(batch: Batch): Promise<CommitVerdict> {
    // Check every value before anything is sent; lock rows in one order so concurrent batches cannot deadlock.
    for (const p of batch.puts) {
      noNul("scope", p.scope);
      noNul("key", p.key);
      if (p.row) noNul("body", p.row.body);
      if (p.expected !== undefined) int("postgres", "expected version", p.expected);
      if (p.row) int("postgres", "version", p.row.version);
      if (p.row?.dueAt !== undefined) int("postgres", "due_at", p.row.dueAt);
    }
    for (const e of batch.events) {
      for (const [what, v] of [["audit scope", e.scope], ["audit key", e.key], ["audit kind", e.kind], ["audit detail", e.detail]]) {
        noNul(what, v);
      }
      int("postgres", "audit version", e.version);
      int("postgres", "audit at", e.at);
    }
    const puts = [...batch.puts].sort(
      (a, b) => TABLE_ORDER[a.table] - TABLE_ORDER[b.table] || utf8cmp(a.scope, b.scope) || utf8cmp(a.key, b.key),
    );
    const events = [...batch.events].sort(
      (a, b) => utf8cmp(a.scope, b.scope) || utf8cmp(a.key, b.key) || (a.version < b.version ? -1 : a.version > b.version ? 1 : 0),
    );
    const s = this.s;
    for (let rolledBack = 0; ; rolledBack++) {
      const c = await this.pool.connect();
      let broken = false;
      try {
        await c.query("BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE");
        try {
          for (const p of puts) {
            const r = p.row;
            let n: number;
            if (p.expected === undefined && r) {
              n = (await c.query(
                `INSERT INTO ${s}.rows (tbl, scope, key, version, state, due_at, body, owner) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING`,
                [p.table, p.scope, p.key, String(r.version), r.state ?? null, r.dueAt === undefined ? null : String(r.dueAt), r.body, r.owner ?? null],
              )).rowCount!;
            } else if (r) {
              n = (await c.query(
                `UPDATE ${s}.rows SET version = $5, state = $6, due_at = $7, body = $8, owner = $9 WHERE tbl = $1 AND scope = $2 AND key = $3 AND version = $4`,
                [p.table, p.scope, p.key, String(p.expected), String(r.version), r.state ?? null, r.dueAt === undefined ? null : String(r.dueAt), r.body, r.owner ?? null],
              )).rowCount!;
            } else if (p.expected !== undefined) {
              n = (await c.query(`DELETE FROM ${s}.rows WHERE tbl = $1 AND scope = $2 AND key = $3 AND version = $4`, [
                p.table, p.scope, p.key, String(p.expected),
              ])).rowCount!;
            } else {
              // "Must not exist, and stays absent": take the key as an insert would, then let go.
              n = (await c.query(
                `INSERT INTO ${s}.rows (tbl, scope, key, version, state, due_at, body) VALUES ($1, $2, $3, 0, NULL, NULL, '') ON CONFLICT DO NOTHING`,
                [p.table, p.scope, p.key],
              )).rowCount!;
              if (n === 1) await c.query(`DELETE FROM ${s}.rows WHERE tbl = $1 AND scope = $2 AND key = $3`, [p.table, p.scope, p.key]);
            }
            if (n !== 1) throw new Conflict();
          }
          for (const e of events) {
            const n = (await c.query(
              `INSERT INTO ${s}.audit (scope, key, version, at, kind, from_state, to_state, attempt, detail) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING`,
              [e.scope, e.key, String(e.version), String(e.at), e.kind, e.fromState ?? null, e.toState ?? null, e.attempt ?? null, e.detail],
            )).rowCount!;
            if (n !== 1) throw new Conflict();
          }
        } catch (e) {
          await c.query("ROLLBACK").catch(() => (broken = true));
          if (e instanceof Conflict) return { tag: "conflict" };
          if (RETRYABLE.has((e as { code?: string }).code ?? "") && rolledBack < MAX_ROLLED_BACK) continue;
          return { tag: "failed", val: { message: `postgres: ${(e as Error).message}` } };
        }
        try {
          await c.query("COMMIT");
          return { tag: "applied" };
        } catch (e) {
          broken = true;
          if (RETRYABLE.has((e as { code?: string }).code ?? "") && rolledBack < MAX_ROLLED_BACK) continue;
          return {
            tag: "failed",
            val: {
              message: `postgres: COMMIT failed; the batch is not known to be durable (it may or may not have applied): ${(e as Error).message}`,
            },
          };
        }
      } catch (e) {
        broken = true;
        return { tag: "failed", val: { message: `postgres: begin transaction: ${(e as Error).message}` } };
      } finally {
        c.release(broken);
      }
    }
  }

  async scan(table: Table, states: State[], dueBefore: bigint, owner: string | undefined, limit: number): Promise<Row[]> {
    const bound = String(dueBefore > I64_MAX ? I64_MAX : dueBefore);
    const s = this.s;
    const r = states.length === 0
      ? await this.pool.query(
          `SELECT ${ROW_COLUMNS} FROM ${s}.rows WHERE tbl = $1 AND due_at IS NOT NULL AND due_at <= $2 AND ($4::text IS NULL OR owner = $4) ORDER BY due_at, scope, key LIMIT $3`,
          [table, bound, limit, owner ?? null],
        )
      : await this.pool.query(
          `SELECT ${ROW_COLUMNS} FROM ${s}.rows WHERE tbl = $1 AND due_at IS NOT NULL AND due_at <= $2 AND state = ANY($5) AND ($4::text IS NULL OR owner = $4) ORDER BY due_at, scope, key LIMIT $3`,
          [table, bound, limit, owner ?? null, states],
        );
    return r.rows.map(cook);
  }

  async audit(scope: string, key: string): Promise<AuditEvent[]> {
    const r = await this.pool.query(
      `SELECT scope, key, version, at, kind, from_state, to_state, attempt, detail FROM ${this.s}.audit WHERE scope = $1 AND key = $2 ORDER BY version`,
      [scope, key],
    );
    return r.rows.map((e) => ({
      scope: e.scope,
      key: e.key,
      version: BigInt(e.version),
      at: BigInt(e.at),
      kind: e.kind,
      fromState: e.from_state ?? undefined,
      toState: e.to_state ?? undefined,
      attempt: e.attempt === null ? undefined : Number(e.attempt),
      detail: e.detail,
    }));
  }

  async close(): Promise<void> {
    await this.pool.end();
  }
}
