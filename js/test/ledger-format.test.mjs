// The same ledger format as the Rust host: `once ledger list/show/resolve` on a
// Node-written SQLite file and PostgreSQL schema, and records crossing Rust and Node both ways.
import assert from "node:assert/strict";
import { test } from "node:test";
import { join } from "node:path";
import Database from "better-sqlite3";
import { Once, sent } from "../dist/index.js";
import { binary, databaseUrl, execFileSync, once, schemaFor, tempDir, withSchema } from "./helpers.mjs";

const ARGS = { order_id: 1234, amount: 200 };

/** Node leaves one record confirmed and one unknown (a lost reply, no lookup); Rust resolves the unknown; Node replays it. */
async function crossing(location, scopeArgs) {
  let sends = 0;
  const node = await Once.open(location);
  const done = await node.call({ scope: "tenant-7", key: "refund-1", tool: "refund_order", args: ARGS,
    send: async () => (sends++, sent.success({ refund_id: "r-1" })) });
  assert.equal(done.account.ending.tag, "confirmed");
  const lost = await node.call({ scope: "tenant-7", key: "refund-2", tool: "refund_order", args: ARGS,
    send: async () => (sends++, sent.ambiguous("connection reset after the request was sent")) });
  assert.equal(lost.account.ending.tag, "unknown");
  await node.close();

  // Rust reads what Node wrote.
  const list = once("ledger", "list", "--db", location);
  assert.match(list, /tenant-7\s+refund-1\s+confirmed\s+2/);
  assert.match(list, /tenant-7\s+refund-2\s+unknown/);
  const show = once("ledger", "show", "--db", location, "--scope", "tenant-7", "refund-1");
  assert.match(show, /r-1/);
  // Rust writes: an operator's resolution of Node's unknown record.
  once("ledger", "resolve", "--db", location, "--scope", "tenant-7", "refund-2",
    "--confirmed", '{"refund_id":"r-2","by":"operator"}', "--note", "read from the provider's dashboard", ...scopeArgs);

  // Node reads what Rust wrote: the receipt replays, nothing is sent again.
  const again = await Once.open(location);
  const replay = await again.call({ scope: "tenant-7", key: "refund-2", tool: "refund_order", args: ARGS,
    send: async () => (sends++, sent.success({ refund_id: "WRONG" })) });
  assert.equal(replay.account.ending.tag, "confirmed");
  assert.equal(replay.account.ending.val.replayed, true);
  assert.deepEqual(JSON.parse(replay.account.ending.val.receipt), { refund_id: "r-2", by: "operator" });
  const view = await again.inspect("tenant-7", "refund-2");
  assert.ok(view.audit.some((e) => e.kind === "operator-confirmed"), `an operator event in ${view.audit.map((e) => e.kind)}`);
  await again.close();
  assert.equal(sends, 2);
}

test("SQLite: once ledger list/show/resolve on a Node-written file; Rust and Node records cross", async (t) => {
  await crossing(join(tempDir(t), "ledger.db"), []);
});

test("SQLite: a record the Rust host created (host/once/examples/embed.rs) is answered by Node as Rust left it", async (t) => {
  const dir = tempDir(t);
  const embed = binary("ONCE_EMBED", "examples/embed", "cargo build -p once-host --example embed");
  execFileSync(embed, [], { cwd: dir, stdio: "ignore" });
  // The example's sender sends nothing: Rust spent the attempt budget, each attempt not sent.
  assert.match(once("ledger", "list", "--db", join(dir, "once.db")), /tenant-7\s+refund-order-1234\s+failed/);
  const node = await Once.sqlite(join(dir, "once.db"));
  let sends = 0;
  const called = await node.call({ scope: "tenant-7", key: "refund-order-1234", tool: "refund_order",
    argsJson: '{"order_id":1234,"amount":200}', send: async () => (sends++, sent.success({ refund_id: "r-9" })) });
  assert.equal(called.account.ending.tag, "not-sent");
  assert.equal(called.account.ending.val.attempts, 3);
  assert.equal(called.account.repeat, "refused");
  // A different payload under Rust's key is a conflict with Rust's record.
  const changed = await node.call({ scope: "tenant-7", key: "refund-order-1234", tool: "refund_order",
    args: { order_id: 1234, amount: 300 }, send: async () => (sends++, sent.success({})) });
  assert.equal(changed.account.ending.tag, "conflict");
  assert.equal(changed.account.ending.val.args, '{"amount":200,"order_id":1234}');
  await node.close();
  assert.equal(sends, 0);
});

test("PostgreSQL: once ledger list/show/resolve on a Node-written schema; Rust and Node records cross", async (t) => {
  const url = databaseUrl(t);
  if (!url) return;
  const schema = await schemaFor(t, url);
  await crossing(withSchema(url, schema), []);
});

/** The schema objects of an SQLite file, as SQLite keeps their SQL (whitespace collapsed: the source's indentation differs). */
function sqliteSchema(path) {
  const db = new Database(path, { readonly: true });
  const rows = db
    .prepare("SELECT type, name, sql FROM sqlite_master ORDER BY type, name")
    .all()
    .map((r) => ({ ...r, sql: r.sql && r.sql.replace(/\s+/g, " ") }));
  const version = db.prepare("SELECT value FROM meta WHERE key = 'schema_version'").get();
  db.close();
  return { rows, version };
}

test("SQLite: a file Node creates has the schema of one the Rust host creates", async (t) => {
  const dir = tempDir(t);
  const node = await Once.sqlite(join(dir, "node.db"));
  await node.close();
  execFileSync(binary("ONCE_EMBED", "examples/embed", "cargo build -p once-host --example embed"), [], { cwd: dir, stdio: "ignore" });
  assert.deepEqual(sqliteSchema(join(dir, "node.db")), sqliteSchema(join(dir, "once.db")));
});

test("PostgreSQL: a schema Node creates has the tables, columns, indexes and trigger of one the Rust host creates", async (t) => {
  const url = databaseUrl(t);
  if (!url) return;
  const [nodeSchema, rustSchema] = [await schemaFor(t, url), await schemaFor(t, url)];
  const node = await Once.postgres(withSchema(url, nodeSchema));
  await node.close();
  once("ledger", "list", "--db", withSchema(url, rustSchema)); // the Rust host creates its schema on open
  const pg = (await import("pg")).default;
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  t.after(() => c.end());
  const shape = async (schema) => ({
    columns: (await c.query(
      `SELECT table_name, column_name, data_type, is_nullable, collation_name, ordinal_position
       FROM information_schema.columns WHERE table_schema = $1 ORDER BY table_name, ordinal_position`, [schema])).rows,
    indexes: (await c.query(
      "SELECT tablename, indexname, replace(indexdef, $1, 'S') AS def FROM pg_indexes WHERE schemaname = $2 ORDER BY indexname",
      [`${schema}.`, schema])).rows,
    triggers: (await c.query(
      "SELECT event_object_table, trigger_name, event_manipulation FROM information_schema.triggers WHERE trigger_schema = $1 ORDER BY trigger_name, event_manipulation",
      [schema])).rows,
    meta: (await c.query(`SELECT key, value FROM ${schema}.meta ORDER BY key`)).rows,
  });
  assert.deepEqual(await shape(nodeSchema), await shape(rustSchema));
});

/** Plain access to a ledger's `meta` (an SQLite file, or a PostgreSQL schema): its `body_format`, read and set. */
async function metaOf(t, location) {
  if (!location.startsWith("postgres")) {
    return {
      read: async () => {
        const db = new Database(location, { readonly: true });
        try {
          return db.prepare("SELECT value FROM meta WHERE key = 'body_format'").get()?.value;
        } finally {
          db.close();
        }
      },
      set: async (value) => {
        const db = new Database(location);
        try {
          db.prepare("DELETE FROM meta WHERE key = 'body_format'").run();
          if (value !== undefined) db.prepare("INSERT INTO meta (key, value) VALUES ('body_format', ?)").run(value);
        } finally {
          db.close();
        }
      },
      name: location,
    };
  }
  const [url, schema] = location.split("?schema=");
  const pg = (await import("pg")).default;
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  t.after(() => c.end());
  return {
    read: async () => (await c.query(`SELECT value FROM ${schema}.meta WHERE key = 'body_format'`)).rows[0]?.value,
    set: async (value) => {
      await c.query(`DELETE FROM ${schema}.meta WHERE key = 'body_format'`);
      if (value !== undefined) await c.query(`INSERT INTO ${schema}.meta (key, value) VALUES ('body_format', $1)`, [value]);
    },
    name: `schema ${schema} on ${url.split("@").pop().split("?")[0]}`,
  };
}

/** The engine's body format is recorded on open (a new ledger, one from before the key, an earlier format); a later one is refused. */
async function bodyFormat(t, location) {
  const o = await Once.open(location);
  const format = o["configured"].bodyFormat;
  await o.close();
  const meta = await metaOf(t, location);
  assert.equal(await meta.read(), String(format), "a new ledger records the engine's format");
  for (const left of [undefined, "0"]) {
    await meta.set(left);
    const again = await Once.open(location);
    await again.close();
    assert.equal(await meta.read(), String(format), `left as ${left}`);
  }
  await meta.set(String(format + 1));
  await assert.rejects(Once.open(location), (e) => {
    assert.equal(e.name, "StorageError");
    assert.equal(
      e.message,
      `storage: ledger ${meta.name} holds record bodies of format ${format + 1}; this build of once reads format ${format}: ` +
        `upgrade once (any build reading format ${format + 1})`,
    );
    return true;
  });
  assert.equal(await meta.read(), String(format + 1), "the refusal wrote nothing");
}

test("SQLite: the ledger records the engine's body format, and one of a later format is refused", async (t) => {
  await bodyFormat(t, join(tempDir(t), "ledger.db"));
});

test("PostgreSQL: the schema records the engine's body format, and one of a later format is refused", async (t) => {
  const url = databaseUrl(t);
  if (!url) return;
  await bodyFormat(t, withSchema(url, await schemaFor(t, url)));
});
