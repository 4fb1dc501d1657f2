// The same ledger format as the Rust host: `once ledger list/show/resolve` on a
// Node-written SQLite file and PostgreSQL schema, and records crossing Rust and Node both ways;
// new and upgraded ledgers alike in Node, Rust and Python, down to their SQL.
import assert from "node:assert/strict";
import { test } from "node:test";
import { copyFileSync } from "node:fs";
import { join } from "node:path";
import Database from "better-sqlite3";
import { Once, sent } from "../dist/index.js";
import { binary, databaseUrl, execFileSync, once, python, schemaFor, tempDir, withSchema } from "./helpers.mjs";

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

// Every host creates and upgrades a ledger from the same files (the repository's schema/, which this
// package ships), so Node, Rust and Python make ledgers alike, down to the SQL SQLite keeps.

/** Open a ledger as each host's users do, which creates or upgrades it: Node and Python through their packages, Rust with the CLI. */
const opens = {
  node: async (location) => (await Once.open(location)).close(),
  rust: async (location) => void once("ledger", "list", "--db", location),
  python: (py) => async (location) =>
    void execFileSync(py, ["-c", "import sys; from once import Once; l = sys.argv[1]; "
      + "(Once.postgres(l) if l.startswith('postgres') else Once.sqlite(l)).close()", location], { stdio: "pipe" }),
};

/** The schema objects of an SQLite file, as SQLite keeps their SQL, and its `meta`. */
function sqliteSchema(path) {
  const db = new Database(path, { readonly: true });
  try {
    return {
      objects: db.prepare("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name").all(),
      meta: db.prepare("SELECT key, value FROM meta ORDER BY key").all(),
    };
  } finally {
    db.close();
  }
}

/** A PostgreSQL schema's shape, its name written S: columns, constraints, indexes, triggers, functions (their source), `meta`. */
async function pgShape(c, schema) {
  const rows = async (sql) => (await c.query(sql, [schema])).rows;
  return {
    columns: await rows(
      `SELECT table_name, column_name, data_type, is_nullable, collation_name, column_default, ordinal_position
       FROM information_schema.columns WHERE table_schema = $1 ORDER BY table_name, ordinal_position`),
    constraints: await rows(
      `SELECT relname, conname, pg_get_constraintdef(k.oid) AS def
       FROM pg_constraint k JOIN pg_class r ON r.oid = k.conrelid WHERE k.connamespace = $1::regnamespace ORDER BY relname, conname`),
    indexes: await rows(
      "SELECT tablename, indexname, replace(indexdef, $1 || '.', 'S.') AS def FROM pg_indexes WHERE schemaname = $1 ORDER BY indexname"),
    triggers: await rows(
      `SELECT event_object_table, trigger_name, event_manipulation, action_timing, action_orientation,
         replace(action_statement, $1 || '.', 'S.') AS action
       FROM information_schema.triggers WHERE trigger_schema = $1 ORDER BY trigger_name, event_manipulation`),
    functions: await rows(
      `SELECT proname, pg_get_function_arguments(p.oid) AS args, pg_get_function_result(p.oid) AS result, l.lanname,
         replace(prosrc, '"' || $1 || '"', 'S') AS source
       FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang WHERE pronamespace = $1::regnamespace ORDER BY proname`),
    meta: (await c.query(`SELECT key, value FROM ${schema}.meta ORDER BY key`)).rows,
  };
}

async function pgClient(t, url) {
  const pg = (await import("pg")).default;
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  t.after(() => c.end());
  return c;
}

/** Each host's new SQLite file, compared with Node's: the same objects in the same SQL, the same `meta`. */
async function sqliteAlike(t, hosts) {
  const dir = tempDir(t);
  const made = {};
  for (const [name, open] of Object.entries(hosts)) {
    await open(join(dir, `${name}.db`));
    made[name] = sqliteSchema(join(dir, `${name}.db`));
  }
  for (const name of Object.keys(hosts)) assert.deepEqual(made[name], made.node, `${name} vs node`);
  assert.deepEqual(made.node.objects.map((o) => o.name),
    ["audit_kind", "rows_due", "rows_owner_due", "rows_state", "sqlite_autoindex_meta_1", "audit", "meta", "rows"]);
}

/** Each host's new PostgreSQL schema, compared with Node's. */
async function postgresAlike(t, url, hosts) {
  const c = await pgClient(t, url);
  const made = {};
  for (const [name, open] of Object.entries(hosts)) {
    const schema = await schemaFor(t, url);
    await open(withSchema(url, schema));
    made[name] = await pgShape(c, schema);
  }
  for (const name of Object.keys(hosts)) assert.deepEqual(made[name], made.node, `${name} vs node`);
  assert.deepEqual(made.node.functions.map((f) => f.proname), ["apply_batch", "audit_is_append_only"]);
  assert.ok(made.node.functions[0].source.includes("INSERT INTO S.rows"), made.node.functions[0].source);
}

test("SQLite: a file Node creates has the schema of one the Rust host creates, in the same SQL", async (t) => {
  await sqliteAlike(t, { node: opens.node, rust: opens.rust });
});

test("SQLite: a file the Python package creates has the schema of one Node creates, in the same SQL", async (t) => {
  const py = python(t);
  if (!py) return;
  await sqliteAlike(t, { node: opens.node, python: opens.python(py) });
});

test("PostgreSQL: a schema Node creates has the columns, constraints, indexes, trigger and functions of one the Rust host creates", async (t) => {
  const url = databaseUrl(t);
  if (!url) return;
  await postgresAlike(t, url, { node: opens.node, rust: opens.rust });
});

test("PostgreSQL: a schema the Python package creates has the shape of one Node creates, apply_batch's source included", async (t) => {
  const url = databaseUrl(t);
  const py = url && python(t);
  if (!py) return;
  await postgresAlike(t, url, { node: opens.node, python: opens.python(py) });
});

test("SQLite: a version-1 file is upgraded alike by Node, Rust and Python, its operation rows given to default", async (t) => {
  const py = python(t);
  if (!py) return;
  const dir = tempDir(t);
  const v1 = join(dir, "v1.db");
  await opens.node(v1);
  // Cut back to version 1: no owner column, no owner index (the layout before operation rows named their owner).
  const db = new Database(v1);
  db.exec(`DROP INDEX rows_owner_due; ALTER TABLE rows DROP COLUMN owner;
    UPDATE meta SET value = '1' WHERE key = 'schema_version';
    INSERT INTO rows (tbl, scope, key, version, state, due_at, body) VALUES ('operation', 's', 'k', 3, 'unknown', 50, '{}');`);
  db.pragma("wal_checkpoint(TRUNCATE)");
  db.close();
  const made = {};
  for (const [name, open] of Object.entries({ node: opens.node, rust: opens.rust, python: opens.python(py) })) {
    const path = join(dir, `${name}.db`);
    copyFileSync(v1, path);
    await open(path);
    made[name] = sqliteSchema(path);
    const raw = new Database(path, { readonly: true });
    assert.deepEqual(raw.prepare("SELECT tbl, key, owner FROM rows").all(), [{ tbl: "operation", key: "k", owner: "default" }], name);
    raw.close();
  }
  assert.deepEqual(made.rust, made.node);
  assert.deepEqual(made.python, made.node);
  assert.deepEqual(made.node.meta.find((m) => m.key === "schema_version"), { key: "schema_version", value: "2" });
});

test("PostgreSQL: a version-1 schema is upgraded alike by Node, Rust and Python (owner, its index, apply_batch)", async (t) => {
  const url = databaseUrl(t);
  const py = url && python(t);
  if (!py) return;
  const c = await pgClient(t, url);
  const made = {};
  for (const [name, open] of Object.entries({ node: opens.node, rust: opens.rust, python: opens.python(py) })) {
    const schema = await schemaFor(t, url);
    await opens.node(withSchema(url, schema));
    // Cut back to version 1: no owner column or index, no apply_batch.
    await c.query(`DROP FUNCTION ${schema}.apply_batch; DROP INDEX ${schema}.rows_owner_due;
      ALTER TABLE ${schema}.rows DROP COLUMN owner; UPDATE ${schema}.meta SET value = '1' WHERE key = 'schema_version';
      INSERT INTO ${schema}.rows (tbl, scope, key, version, state, due_at, body) VALUES ('operation', 's', 'k', 3, 'unknown', 50, '{}')`);
    await open(withSchema(url, schema));
    made[name] = await pgShape(c, schema);
    assert.deepEqual((await c.query(`SELECT tbl, key, owner FROM ${schema}.rows`)).rows, [{ tbl: "operation", key: "k", owner: "default" }], name);
  }
  assert.deepEqual(made.rust, made.node);
  assert.deepEqual(made.python, made.node);
  assert.deepEqual(made.node.meta.find((m) => m.key === "schema_version"), { key: "schema_version", value: "3" });
  assert.deepEqual(made.node.functions.map((f) => f.proname), ["apply_batch", "audit_is_append_only"]);
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
