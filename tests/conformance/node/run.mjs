// The conformance suite (tests/conformance/) through the once component, hosted by Node.js.
//
// The component file is transpiled by jco (`jco transpile --instantiation sync`)
// into a temporary folder; this runner supplies only its imports: a
// compare-and-swap record store (in memory, or SQLite via better-sqlite3), a
// manual clock, scripted provider evidence, a recording escalation sink and a
// witness that keeps nothing —
// and configures each instance (`configure`) with the settings and the tool
// policy a step needs. Every decision comes from the component. A typed run
// drives calls through `driver` and answers the typed `ledger`, as the npm
// package does; a ledger-json run uses the crossings that carry the WIT's
// "JSON form" as text (`protocol.start`, `report`, `resume`, `ledger-json.get`,
// `ledger-json.commit`; the top comment of wit/once.wit), which are written
// here and read with an exact JSON reader (`parseExact`: an integer past 2^53,
// such as an absent row's due-at i64::MAX, stays a BigInt) into the neutral
// form (`neutral`), by the same WIT names the typed values render to.
//
//   node run.mjs --component once_guest.wasm [--store memory|sqlite|all]
//                [--transcripts DIR] [--filter TEXT] [--negative] [--stores MODULE]
//
// --stores MODULE: the stores come from MODULE's `stores.memory()` and
// `stores.sqlite(path)` instead of this file's (js/ runs the scenarios over
// the npm package's own ledgers this way).
//
// Exit status 0 only when every scenario passed on every store asked for
// (and, with --negative, when the deliberately broken store was caught).

import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import Database from "better-sqlite3";

const HERE = dirname(fileURLToPath(import.meta.url));
const REPO = resolve(HERE, "../../..");

// ---------------------------------------------------------------- neutral JSON

function canonical(v) {
  if (v === null || v === undefined) return "null";
  if (typeof v === "bigint") return v.toString();
  if (Array.isArray(v)) return `[${v.map(canonical).join(",")}]`;
  if (typeof v === "object") {
    return `{${Object.keys(v)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical(v[k])}`)
      .join(",")}}`;
  }
  return JSON.stringify(v);
}

const kebab = (name) => name.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`);
const camel = (name) => name.replace(/-([a-z])/g, (_, c) => c.toUpperCase());

function isVariant(v) {
  const keys = Object.keys(v);
  return keys.includes("tag") && keys.every((k) => k === "tag" || k === "val");
}

/** A jco value as neutral JSON: records by WIT field name, variants as {case: payload}. */
function render(v) {
  if (v === undefined || v === null) return null;
  if (typeof v === "bigint") {
    const n = Number(v);
    if (!Number.isSafeInteger(n)) throw new Error(`u64 ${v} is past 2^53`);
    return n;
  }
  if (Array.isArray(v)) return v.map(render);
  if (v instanceof Uint8Array) throw new Error("bytes in an export's answer");
  if (typeof v === "object") {
    if (isVariant(v)) return v.val === undefined ? v.tag : { [v.tag]: render(v.val) };
    const out = {};
    for (const [k, x] of Object.entries(v)) out[kebab(k)] = render(x);
    return out;
  }
  return v;
}

/** Call an export whose WIT result is result<T, E>: T as is, an error as {"error": E}. */
function exportResult(f) {
  try {
    return render(f());
  } catch (e) {
    if (e && Object.prototype.hasOwnProperty.call(e, "payload")) return { error: render(e.payload) };
    throw e;
  }
}

// ---------------------------------------------------------------- the JSON form

/** JSON text as a value, integer literals exact: a BigInt past Number.MAX_SAFE_INTEGER (JSON.parse would round it). */
function parseExact(text) {
  let at = 0;
  const fail = (why) => {
    throw new SyntaxError(`${why} at offset ${at} of ${text.slice(0, 200)}`);
  };
  const ws = () => {
    while (at < text.length && " \t\n\r".includes(text[at])) at++;
  };
  const NUMBER = /-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/y;
  const STRING = /"(?:[^"\\\u0000-\u001f]|\\.)*"/y;
  const value = () => {
    ws();
    const c = text[at];
    if (c === "{") {
      at++;
      const out = {};
      ws();
      if (text[at] === "}") return at++, out;
      for (;;) {
        ws();
        if (text[at] !== '"') fail("expected a member name");
        const k = value();
        ws();
        if (text[at++] !== ":") fail("expected :");
        Object.defineProperty(out, k, { value: value(), enumerable: true, writable: true, configurable: true });
        ws();
        const d = text[at++];
        if (d === "}") return out;
        if (d !== ",") fail("expected , or }");
      }
    }
    if (c === "[") {
      at++;
      const out = [];
      ws();
      if (text[at] === "]") return at++, out;
      for (;;) {
        out.push(value());
        ws();
        const d = text[at++];
        if (d === "]") return out;
        if (d !== ",") fail("expected , or ]");
      }
    }
    if (c === '"') {
      STRING.lastIndex = at;
      const m = STRING.exec(text);
      if (!m) fail("a bad string");
      at = STRING.lastIndex;
      return JSON.parse(m[0]);
    }
    for (const [word, v] of [["true", true], ["false", false], ["null", null]]) {
      if (text.startsWith(word, at)) return (at += word.length), v;
    }
    NUMBER.lastIndex = at;
    const m = NUMBER.exec(text);
    if (!m) fail("unexpected character");
    at = NUMBER.lastIndex;
    const n = Number(m[0]);
    return m[1] === undefined && m[2] === undefined && !Number.isSafeInteger(n) ? BigInt(m[0]) : n;
  };
  const v = value();
  ws();
  if (at !== text.length) fail("trailing data");
  return v;
}

/** A JSON-form case name as its WIT name: `InFlight` -> `in-flight`, `InvalidUtf8` -> `invalid-utf8`. */
const witCase = (name) => name.replace(/(?<!^)(?=[A-Z])/g, "-").toLowerCase();
/** A WIT case name in the JSON form: `not-sent` -> `NotSent`. */
const formCase = (name) => name.replace(/(^|-)([a-z0-9])/g, (_, __, c) => c.toUpperCase());

// Which fields of the JSON form hold enum cases or variants, per type (every other field is data, kept as
// it is); record fields are renamed snake_case -> kebab-case.
const ENUM = "enum";
const CONFIRMED_INFO = { via: ENUM, confirmed_by: ENUM, earlier_attempts: ENUM };
const ENDING = {
  variant: {
    Confirmed: CONFIRMED_INFO, Rejected: {}, NotSent: {}, Unknown: {}, InFlight: {}, Conflict: { state: ENUM },
    Blocked: { reason: ENUM }, Unrecorded: {}, AwaitsApproval: {},
  },
};
const ACCOUNT = { key_source: ENUM, ending: ENDING, effect: ENUM, repeat: ENUM };
const STEP = { variant: { Dispatch: {}, Wait: { reason: ENUM, meanwhile: ACCOUNT }, Done: ACCOUNT, Direct: null } };
const ERROR = {
  variant: {
    InvalidJson: { kind: ENUM }, InvalidRequest: null, InvalidPolicy: null, Storage: null, NotFound: null,
    FenceMismatch: null, InvalidTransition: null, NotConfigured: null,
  },
};
const has = (o, k) => Object.prototype.hasOwnProperty.call(o, k);

/** A value in the JSON form as neutral JSON (WIT names), by its schema above. */
function neutral(v, schema) {
  if (schema === null || schema === undefined || v === null) return v;
  if (schema === ENUM) {
    if (typeof v !== "string") throw new TypeError(`${canonical(v)} is not an enum case`);
    return witCase(v);
  }
  if (schema.variant) {
    const cases = schema.variant;
    if (typeof v === "string") {
      if (!has(cases, v) || cases[v] !== null) throw new TypeError(`${JSON.stringify(v)} is not a case without payload`);
      return witCase(v);
    }
    const keys = v && typeof v === "object" && !Array.isArray(v) ? Object.keys(v) : [];
    if (keys.length !== 1 || !has(cases, keys[0]) || cases[keys[0]] === null) {
      throw new TypeError(`${canonical(v)} is not a case with a payload`);
    }
    return { [witCase(keys[0])]: neutral(v[keys[0]], cases[keys[0]]) };
  }
  if (!v || typeof v !== "object" || Array.isArray(v)) throw new TypeError(`${canonical(v)} is not a record`);
  return Object.fromEntries(Object.entries(v).map(([k, x]) => [k.replace(/_/g, "-"), neutral(x, has(schema, k) ? schema[k] : null)]));
}

/** A protocol export's answer (the JSON form of result<step, error>) in neutral JSON: the step, or {"error": E}. */
function stepAnswer(f) {
  const text = f();
  if (typeof text !== "string") throw new TypeError(`a protocol export answered ${typeof text}, not JSON text`);
  const answer = parseExact(text);
  const keys = answer && typeof answer === "object" && !Array.isArray(answer) ? Object.keys(answer) : [];
  if (keys.length === 1 && keys[0] === "Ok") return neutral(answer.Ok, STEP);
  if (keys.length === 1 && keys[0] === "Err") return { error: neutral(answer.Err, ERROR) };
  throw new TypeError(`not a result: ${text.slice(0, 200)}`);
}

const TABLES_FORM = { Operation: "operation", Tombstone: "tombstone", Quota: "quota" };
const STATES_FORM = new Set([
  "InFlight", "Confirmed", "Failed", "Unknown", "Absent", "Superseded", "AwaitingApproval", "Denied",
]);

function stateName(v) {
  if (v === null) return null;
  if (!STATES_FORM.has(v)) throw new TypeError(`${canonical(v)} is not a state`);
  return witCase(v);
}

/** A u64 of the JSON form, as a number (versions, attempts) or, for timestamps, a BigInt; null stays null. */
function int(v, what, asBig) {
  if (v === null) return null;
  if ((typeof v === "number" && Number.isSafeInteger(v) && v >= 0) || (typeof v === "bigint" && v >= 0n && v < 1n << 64n)) {
    return asBig ? BigInt(v) : v;
  }
  throw new TypeError(`${what}: ${canonical(v)} is not a u64`);
}

/**
 * `ledger-json.commit`'s arguments as neutral puts and events (rows by WIT field name; timestamps as BigInt) and
 * whether the batch is deferrable. Anything else throws: the batch is refused whole.
 */
function batchOf(text, bodies) {
  const head = parseExact(text);
  const written = head.puts.filter((p) => p.row !== null).length;
  if (written !== bodies.length) throw new TypeError(`the batch writes ${written} row(s) but ${bodies.length} bodies came with it`);
  let next = 0;
  const puts = head.puts.map((p) => {
    const table = TABLES_FORM[p.table];
    if (!table) throw new TypeError(`${canonical(p.table)} is not a table`);
    const r = p.row;
    const row =
      r === null
        ? null
        : {
            table,
            scope: p.scope,
            key: p.key,
            version: int(r.version, "version", false),
            state: stateName(r.state),
            "due-at": int(r.due_at, "due_at", true),
            owner: r.owner,
            body: bodies[next++],
          };
    return { table, scope: p.scope, key: p.key, expected: int(p.expected, "expected", false), row };
  });
  const events = head.events.map((e) => ({
    scope: e.scope,
    key: e.key,
    version: int(e.version, "version", false),
    at: int(e.at, "at", false),
    kind: e.kind,
    "from-state": stateName(e.from_state),
    "to-state": stateName(e.to_state),
    attempt: e.attempt,
    detail: e.detail,
  }));
  if (typeof head.deferrable !== "boolean") throw new TypeError(`deferrable: ${canonical(head.deferrable)} is not a bool`);
  return { puts, events, deferrable: head.deferrable };
}

/** `ledger.commit`'s typed batch (jco's values: camelCase, `undefined` for none, u64 as BigInt) as neutral puts and events. */
function typedBatch(b) {
  const none = (v) => (v === undefined ? null : v);
  const num = (v) => (v === undefined ? null : Number(v));
  const puts = b.puts.map((p) => {
    const r = p.row;
    const row = r && {
      table: r.table,
      scope: r.scope,
      key: r.key,
      version: Number(r.version),
      state: none(r.state),
      "due-at": none(r.dueAt),
      owner: none(r.owner),
      body: r.body,
    };
    return { table: p.table, scope: p.scope, key: p.key, expected: num(p.expected), row: row ?? null };
  });
  const events = b.events.map((e) => ({
    scope: e.scope,
    key: e.key,
    version: Number(e.version),
    at: Number(e.at),
    kind: e.kind,
    "from-state": none(e.fromState),
    "to-state": none(e.toState),
    attempt: none(e.attempt),
    detail: e.detail,
  }));
  return { puts, events };
}

function caseOf(v) {
  if (typeof v === "string") return [v, undefined];
  if (v && typeof v === "object" && !Array.isArray(v) && Object.keys(v).length === 1) return Object.entries(v)[0];
  throw new StepError(`expected a variant case, got ${canonical(v)}`);
}

class StepError extends Error {}

// The ops that call an export of the component: each must say what it expects.
const EXPORTS = [
  "configure", "start", "report", "resume", "sweep", "begin", "finish", "reconcile", "await-holder", "prune",
  "inspect", "resolve", "canonicalize", "fingerprint",
];

// ---------------------------------------------------------------- stores

// The error texts of scripted failures, as the component sees them (the Rust
// host shows its storage errors as "storage: ..."; every runner uses these).
const READ_FAILURE = "storage: injected read failure";
const COMMIT_FAILURE = "storage: injected commit failure";
const LOST_REPLY = "storage: injected lost commit reply";
const utf8cmp = (a, b) => Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8"));
// Timestamps in rows stay BigInt end to end: an absent record's due-at is i64::MAX, past 2^53.
const bigcmp = (a, b) => (a < b ? -1 : a > b ? 1 : 0);
const I64_MAX = (1n << 63n) - 1n;
const rowKey = (t, s, k) => JSON.stringify([t, s, k]);

class MemoryStore {
  constructor() {
    this.rows = new Map();
    this.events = new Map();
  }
  get(table, scope, key) {
    const r = this.rows.get(rowKey(table, scope, key));
    return r ? { ...r } : null;
  }
  commit(puts, events) {
    const staged = new Map();
    for (const p of puts) {
      const k = rowKey(p.table, p.scope, p.key);
      const current = staged.has(k) ? staged.get(k) : this.rows.get(k);
      if ((current ? current.version : null) !== p.expected) return "conflict";
      staged.set(k, p.row);
    }
    const fresh = new Map();
    for (const e of events) {
      const k = JSON.stringify([e.scope, e.key, e.version]);
      if (this.events.has(k) || fresh.has(k)) return "conflict";
      fresh.set(k, e);
    }
    for (const [k, row] of staged) {
      if (row === null) this.rows.delete(k);
      else this.rows.set(k, { ...row });
    }
    for (const [k, e] of fresh) this.events.set(k, e);
    return null;
  }
  scan(table, states, dueBefore, owner, limit) {
    const rows = [...this.rows.values()].filter(
      (r) =>
        r.table === table &&
        r["due-at"] !== null &&
        r["due-at"] <= dueBefore &&
        (states.length === 0 || states.includes(r.state)) &&
        (owner === null || r.owner === owner),
    );
    rows.sort((a, b) => bigcmp(a["due-at"], b["due-at"]) || utf8cmp(a.scope, b.scope) || utf8cmp(a.key, b.key));
    return rows.slice(0, limit).map((r) => ({ ...r }));
  }
  audit(scope, key) {
    return [...this.events.values()]
      .filter((e) => e.scope === scope && e.key === key)
      .sort((a, b) => a.version - b.version);
  }
  counts() {
    const n = { operation: 0, tombstone: 0, quota: 0 };
    for (const r of this.rows.values()) n[r.table] += 1;
    return [n, this.events.size];
  }
}

class SqliteStore {
  constructor(path) {
    this.db = new Database(path);
    this.db.pragma("journal_mode = WAL");
    this.db.pragma("synchronous = NORMAL"); // semantics under test, not power loss
    // The ledger's tables as every host makes them: the repository's schema/sqlite (a new file's layout).
    this.db.exec(readFileSync(join(REPO, "schema", "sqlite", "ledger.sql"), "utf8"));
    const cols = "tbl AS 'table', scope, key, version, state, due_at AS 'due-at', owner, body";
    // Rows are read with safe integers (BigInt): due-at may be i64::MAX; versions become numbers again.
    this.q = {
      get: this.db.prepare(`SELECT ${cols} FROM rows WHERE tbl = ? AND scope = ? AND key = ?`).safeIntegers(true),
      insert: this.db.prepare(
        "INSERT INTO rows (tbl, scope, key, version, state, due_at, owner, body) VALUES (?, ?, ?, ?, ?, ?, ?, ?) " +
          "ON CONFLICT DO NOTHING",
      ),
      update: this.db.prepare(
        "UPDATE rows SET version = ?, state = ?, due_at = ?, owner = ?, body = ? " +
          "WHERE tbl = ? AND scope = ? AND key = ? AND version = ?",
      ),
      del: this.db.prepare("DELETE FROM rows WHERE tbl = ? AND scope = ? AND key = ? AND version = ?"),
      event: this.db.prepare("INSERT INTO audit VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"),
      audit: this.db.prepare(
        "SELECT scope, key, version, at, kind, from_state AS 'from-state', to_state AS 'to-state', attempt, detail " +
          "FROM audit WHERE scope = ? AND key = ? ORDER BY version",
      ),
      scan: this.db
        .prepare(
          `SELECT ${cols} FROM rows WHERE tbl = ? AND due_at IS NOT NULL AND due_at <= ? ` +
            "AND (? = '[]' OR state IN (SELECT value FROM json_each(?))) AND (? IS NULL OR owner = ?) " +
            "ORDER BY due_at, scope, key LIMIT ?",
        )
        .safeIntegers(true),
      rowCounts: this.db.prepare("SELECT tbl, count(*) AS n FROM rows GROUP BY tbl"),
      eventCount: this.db.prepare("SELECT count(*) AS n FROM audit"),
    };
  }
  static row(r) {
    return r ? { ...r, version: Number(r.version) } : null;
  }
  get(table, scope, key) {
    return SqliteStore.row(this.q.get.get(table, scope, key));
  }
  commit(puts, events) {
    const q = this.q;
    this.db.exec("BEGIN IMMEDIATE");
    try {
      for (const p of puts) {
        const r = p.row;
        let n;
        if (p.expected === null && r !== null) {
          n = q.insert.run(p.table, p.scope, p.key, r.version, r.state, r["due-at"], r.owner, r.body).changes;
        } else if (r !== null) {
          n = q.update.run(r.version, r.state, r["due-at"], r.owner, r.body, p.table, p.scope, p.key, p.expected).changes;
        } else if (p.expected !== null) {
          n = q.del.run(p.table, p.scope, p.key, p.expected).changes;
        } else {
          n = this.get(p.table, p.scope, p.key) ? 0 : 1;
        }
        if (n !== 1) {
          this.db.exec("ROLLBACK");
          return "conflict";
        }
      }
      for (const e of events) {
        const n = q.event.run(e.scope, e.key, e.version, e.at, e.kind, e["from-state"], e["to-state"], e.attempt, e.detail)
          .changes;
        if (n !== 1) {
          this.db.exec("ROLLBACK");
          return "conflict";
        }
      }
      this.db.exec("COMMIT");
      return null;
    } catch (e) {
      if (this.db.inTransaction) this.db.exec("ROLLBACK");
      throw e;
    }
  }
  scan(table, states, dueBefore, owner, limit) {
    const s = JSON.stringify(states);
    const bound = dueBefore > I64_MAX ? I64_MAX : dueBefore; // SQLite integers are i64
    return this.q.scan.all(table, bound, s, s, owner, owner, limit).map(SqliteStore.row);
  }
  audit(scope, key) {
    return this.q.audit.all(scope, key);
  }
  counts() {
    const n = { operation: 0, tombstone: 0, quota: 0 };
    for (const { tbl, n: c } of this.q.rowCounts.all()) n[tbl] = c;
    return [n, this.q.eventCount.get().n];
  }
  close() {
    this.db.close();
  }
}

/** Store factories from --stores MODULE, if given. */
let STORES = null;

/** A store plus what scenarios script: failures, lost replies, a racing writer, a lost ledger. */
class Scripted {
  constructor(kind, dir, broken) {
    Object.assign(this, { kind, dir, broken, generation: 0, failCommits: 0, loseReplies: 0, failReads: false });
    this.race = null;
    this.inner = null;
    this.wipe();
  }
  wipe() {
    this.generation += 1;
    const path = join(this.dir, `ledger-${this.generation}.db`);
    if (STORES) this.inner = this.kind === "sqlite" ? STORES.sqlite(path) : STORES.memory();
    else this.inner = this.kind === "sqlite" ? new SqliteStore(path) : new MemoryStore();
  }
  commit(puts, events, deferrable) {
    const hook = this.race;
    this.race = null;
    if (hook) hook();
    if (this.failCommits > 0) {
      this.failCommits -= 1;
      return COMMIT_FAILURE;
    }
    if (this.broken) {
      // A deliberately broken store (negative tests): every put applies whatever the version.
      for (const p of puts) {
        const current = this.inner.get(p.table, p.scope, p.key);
        p.expected = current ? current.version : null;
      }
    }
    if (this.broken === "no-conflicts") {
      // ... and a repeated audit event is silently dropped.
      events = events.filter((e) => !this.inner.audit(e.scope, e.key).some((a) => a.version === e.version));
    }
    const outcome = this.inner.commit(puts, events, deferrable);
    if (outcome === null && this.loseReplies > 0) {
      this.loseReplies -= 1;
      return LOST_REPLY;
    }
    return outcome;
  }
}

// ---------------------------------------------------------------- the imports (jco shapes)

const big = (n) => (n === null || n === undefined ? undefined : BigInt(n));
const opt = (v) => (v === null ? undefined : v);

const rowOut = (r) =>
  r && {
    table: r.table,
    scope: r.scope,
    key: r.key,
    version: big(r.version),
    state: opt(r.state),
    dueAt: big(r["due-at"]),
    owner: opt(r.owner),
    body: r.body,
  };
const eventOut = (e) => ({
  scope: e.scope,
  key: e.key,
  version: big(e.version),
  at: big(e.at),
  kind: e.kind,
  fromState: opt(e["from-state"]),
  toState: opt(e["to-state"]),
  attempt: opt(e.attempt),
  detail: e.detail,
});

function imports(run) {
  const failed = (message) => ({ tag: "failed", val: { message } });
  // `ledger-json`'s `get` and `commit` answer the JSON form of a `got` / `committed`.
  const failedText = (message) => JSON.stringify({ Failed: { message } });
  const readsFail = () => run.storage.failReads;
  // A run answers get and commit in the encoding it configured; the other one's answer `failed`, as a
  // host's must (wit/once.wit), and the call fails the scenario whatever the guest makes of the answer.
  const wrong = (encoding) => {
    if (run.encoding === encoding) return false;
    const why = `the guest called the ${encoding} encoding's get or commit in a ${run.encoding} run`;
    run.failures.push(`${run.name}: ${why}`);
    return why;
  };
  const answer = (outcome) => (outcome === null ? "applied" : outcome === "conflict" ? "conflict" : outcome);
  const ifaces = {
    "once:core/types@2.0.0": {},
    "once:core/ledger-json@2.0.0": {
      get(table, scope, key) {
        const why = wrong("json");
        if (why) return failedText(why);
        if (readsFail()) return failedText(READ_FAILURE);
        const row = run.storage.inner.get(table, scope, key);
        if (!row) return '"Missing"';
        return `{"Found":{"version":${BigInt(row.version)},"body":${JSON.stringify(row.body)}}}`;
      },
      commit(text, bodies) {
        const why = wrong("json");
        if (why) return failedText(why);
        let batch;
        try {
          batch = batchOf(text, bodies);
        } catch (e) {
          return failedText(`ledger-json.commit: not the JSON form of a batch-head: ${e.message}`);
        }
        const outcome = answer(run.storage.commit(batch.puts, batch.events, batch.deferrable));
        return outcome === "applied" ? '"Applied"' : outcome === "conflict" ? '"Conflict"' : failedText(outcome);
      },
    },
    "once:core/ledger@2.0.0": {
      get(table, scope, key) {
        const why = wrong("typed");
        if (why) return failed(why);
        if (readsFail()) return failed(READ_FAILURE);
        const row = run.storage.inner.get(table, scope, key);
        return row ? { tag: "found", val: { version: BigInt(row.version), body: row.body } } : { tag: "missing" };
      },
      commit(batch) {
        const why = wrong("typed");
        if (why) return failed(why);
        // As the Rust and Node hosts: a written row must be its put's (the JSON form cannot say otherwise).
        const i = batch.puts.findIndex((p) => p.row && (p.row.table !== p.table || p.row.scope !== p.scope || p.row.key !== p.key));
        if (i >= 0) return failed(`ledger.commit: puts/${i}: the row is not the put's`);
        const { puts, events } = typedBatch(batch);
        const outcome = answer(run.storage.commit(puts, events, batch.deferrable));
        return outcome === "applied" || outcome === "conflict" ? { tag: outcome } : failed(outcome);
      },
      scan(table, states, dueBefore, owner, limit) {
        if (readsFail()) return failed(READ_FAILURE);
        const rows = run.storage.inner.scan(table, states, BigInt(dueBefore), owner ?? null, limit).map(rowOut);
        return { tag: "found", val: { rows } };
      },
      audit(scope, key) {
        if (readsFail()) return failed(READ_FAILURE);
        return { tag: "found", val: { events: run.storage.inner.audit(scope, key).map(eventOut) } };
      },
    },
    "once:core/clock@2.0.0": {
      now: () => BigInt(run.now),
    },
    "once:core/provider@2.0.0": {
      lookup(tool, providerKey, args) {
        run.lookups.push({ tool, "provider-key": providerKey, args });
        return run.evidence.shift() ?? { tag: "unknown", val: "no scripted evidence" };
      },
    },
    "once:core/operator@2.0.0": {
      escalate(e) {
        run.escalations.push(render(e));
        return run.ack;
      },
    },
    // Fixed, as in every runner: the ledger's secret, so every provider key, is the same.
    "once:core/entropy@2.0.0": {
      fill: (n) => Uint8Array.from({ length: n }, (_, i) => ENTROPY[i % ENTROPY.length]),
    },
    // Keeps nothing, as a host with nowhere outside its ledger does (wit/once.wit `witness`): no scenario
    // restores an older ledger, and the transcripts stay what every runner writes without a witness.
    "once:core/witness@2.0.0": {
      seen: () => ({ tag: "nothing" }),
      keep: () => undefined,
      forget: () => undefined,
    },
  };
  // jco's generated code looks interfaces up without their version.
  return Object.fromEntries(Object.entries(ifaces).map(([name, iface]) => [name.replace(/@[^@]*$/, ""), iface]));
}

/** What every runner's `entropy.fill` answers (cycled to the length asked); see README.md. */
const ENTROPY = new TextEncoder().encode("once conformance: a fixed secret");
/** The key of the row the component keeps the ledger's provider-key secret in (table quota, scope ""). */
const SECRET_KEY = "once:provider-key-secret";

// ---------------------------------------------------------------- the component

function transpile(component) {
  const out = mkdtempSync(join(tmpdir(), "once-jco-"));
  const jco = join(HERE, "node_modules", "@bytecodealliance", "jco", "dist", "jco.js");
  execFileSync(process.execPath, [jco, "transpile", component, "-o", out, "--name", "once", "--instantiation", "sync", "--quiet"], {
    stdio: ["ignore", "ignore", "inherit"],
  });
  writeFileSync(join(out, "package.json"), '{"type":"module"}');
  return out;
}

async function loadRuntime(component) {
  const dir = transpile(component);
  const mod = await import(pathToFileURL(join(dir, "once.js")).href);
  const modules = new Map();
  const getCoreModule = (path) => {
    if (!modules.has(path)) modules.set(path, new WebAssembly.Module(readFileSync(join(dir, path))));
    return modules.get(path);
  };
  // One object per instance with every export of `engine`, `protocol` and `transitions`, and the typed
  // `driver` beside them (its start, report and resume share the JSON ones' names).
  const instantiate = (imp) => {
    const exports = mod.instantiate(getCoreModule, imp);
    return { ...exports.engine, ...exports.protocol, ...exports.transitions, driver: exports.driver };
  };
  return { dir, instantiate };
}

// policy-input fields (WIT names) and those that are u64 (BigInt in jco).
const POLICY_FIELDS = [
  "route", "identity", "key-argument", "key-sent-by-host", "effect-fields", "verify-first", "provider-claims-key",
  "lookup", "max-in-flight-ms", "dispatch-timeout-ms", "lease-ms", "attempt-budget", "derived-window-ms",
  "resolve-deadline-ms", "reconcile-interval-ms", "retention-ms", "tombstone-retention-ms", "quota", "descriptor-pin",
  "approval", "approval-valid-ms", "approval-wait-ms", "provider-account",
];
const U64_FIELDS = new Set([
  "max-in-flight-ms", "dispatch-timeout-ms", "lease-ms", "derived-window-ms", "resolve-deadline-ms",
  "reconcile-interval-ms", "retention-ms", "tombstone-retention-ms", "approval-valid-ms", "approval-wait-ms",
]);

/** A neutral policy (an object of policy-input overrides) as jco's policy-input: the rest unset. */
function policyRecord(p) {
  const out = Object.fromEntries(POLICY_FIELDS.map((k) => [camel(k), undefined]));
  for (const [k, x] of Object.entries(p)) {
    if (!POLICY_FIELDS.includes(k)) throw new StepError(`unknown policy field ${k}`);
    if (x === null || x === undefined) continue;
    if (k === "quota") {
      out.quota = {
        spendField: x["spend-field"],
        ceiling: x.ceiling,
        decimals: x.decimals ?? undefined,
        windowMs: BigInt(x["window-ms"]),
        bucket: x.bucket ?? undefined,
      };
    } else if (k === "approval") {
      const [tag, val] = caseOf(x);
      out.approval = val === null || val === undefined ? { tag } : { tag, val: { field: val.field, above: val.above } };
    } else out[camel(k)] = U64_FIELDS.has(k) ? BigInt(x) : x;
  }
  return out;
}

function descriptorRecord(v) {
  if (v === null || v === undefined) return undefined;
  return { name: v.name, inputSchema: v["input-schema"], annotations: v.annotations ?? undefined };
}

function configurationRecord(c, encoding) {
  const s = c.settings;
  return {
    settings: {
      maxInputBytes: s["max-input-bytes"],
      maxDepth: s["max-depth"],
      maxKeyBytes: s["max-key-bytes"],
      clockSkewMs: BigInt(s["clock-skew-ms"]),
      owner: s.owner,
    },
    defaults: policyRecord(c.defaults),
    tools: c.tools.map((t) => ({ tool: t.tool, policy: policyRecord(t.policy), descriptor: descriptorRecord(t.descriptor) })),
    ledgerEncoding: encoding,
    reads: "import",
  };
}

/** An instance of the component, and the configuration (neutral JSON) it was last configured with. */
class Agent {
  constructor(exports, encoding) {
    this.x = exports;
    this.encoding = encoding;
    this.configured = null;
  }
  /** The `configure` export with a neutral configuration: its answer in neutral JSON. */
  configure(configuration) {
    const answer = exportResult(() => this.x.configure(configurationRecord(configuration, this.encoding)));
    if (!isError(answer)) this.configured = canonical(configuration);
    return answer;
  }
  /** Configure as `configuration` unless already so; a refusal is the step's answer. */
  ensure(configuration) {
    if (this.configured === canonical(configuration)) return null;
    const answer = this.configure(configuration);
    return isError(answer) ? answer : null;
  }
}

// ---------------------------------------------------------------- a scenario run

function special(v) {
  if (v && typeof v === "object" && !Array.isArray(v)) {
    const keys = Object.keys(v);
    if (keys.length === 1 && keys[0].startsWith("$")) return [keys[0], v[keys[0]]];
  }
  return null;
}

const isError = (v) => v !== null && typeof v === "object" && !Array.isArray(v) && canonical(Object.keys(v)) === '["error"]';

function hexBytes(text) {
  const out = [];
  for (const word of text.split(/\s+/).filter(Boolean)) {
    for (let i = 0; i < word.length; i += 2) out.push(parseInt(word.slice(i, i + 2), 16));
  }
  return Uint8Array.from(out);
}

function deepEqual(a, b) {
  return canonical(a) === canonical(b) && typeof a === typeof b;
}

class Run {
  constructor(runtime, vectors, name, scenario, kind, encoding, dir, broken) {
    Object.assign(this, { runtime, vectors, name, scenario, encoding });
    this.start = scenario.start ?? 1000000;
    this.now = this.start;
    this.settings = {};
    this.evidence = [];
    this.lookups = [];
    this.escalations = [];
    this.ack = true;
    this.storage = new Scripted(kind, dir, broken);
    this.vars = new Map();
    this.transcript = [];
    this.failures = [];
    this.other = null;
    // The engine's own default settings, then the scenario's.
    this.settings = render(this.agent().x.defaultSettings());
    Run.setSettings(this.settings, scenario.settings);
  }

  agent() {
    return new Agent(this.runtime.instantiate(imports(this)), this.encoding);
  }

  static setSettings(settings, overrides) {
    for (const [k, v] of Object.entries(overrides ?? {})) {
      if (!(k in settings)) throw new StepError(`unknown setting ${k}`);
      settings[k] = v;
    }
  }

  /** What a step that is not a call needs: the current settings (any tools). */
  ensureSettings(agent) {
    if (agent.configured !== null && canonical(JSON.parse(agent.configured).settings) === canonical(this.settings)) return null;
    return agent.ensure({ settings: this.settings, defaults: {}, tools: [] });
  }

  /** What a begin or start needs: its tool with the step's policy and descriptor (none of either: the defaults). */
  ensureTool(agent, tool, policy, descriptor) {
    const tools =
      Object.keys(policy).length === 0 && (descriptor === null || descriptor === undefined)
        ? []
        : [{ tool, policy, descriptor: descriptor ?? null }];
    return agent.ensure({ settings: this.settings, defaults: {}, tools });
  }

  fail(label, msg) {
    this.failures.push(`${this.name} step ${label}: ${msg}`);
  }

  dflt(step, field) {
    if (field in step) return step[field];
    return (this.scenario.defaults ?? {})[field] ?? null;
  }

  vector(path) {
    return readFileSync(join(this.vectors, path));
  }

  csv(path, key) {
    for (const line of this.vector(path).toString("utf8").split(/\r?\n/)) {
      const i = line.indexOf(",");
      if (i >= 0 && line.slice(0, i) === key) return line.slice(i + 1);
    }
    throw new StepError(`${path}: no row ${key}`);
  }

  variable(path) {
    const [name, ...parts] = path.split("/");
    if (!this.vars.has(name)) throw new StepError(`no saved result ${JSON.stringify(name)}`);
    let cur = this.vars.get(name);
    for (const p of parts) {
      if (cur && typeof cur === "object" && !Array.isArray(cur) && p in cur) cur = cur[p];
      else if (Array.isArray(cur) && /^\d+$/.test(p) && Number(p) < cur.length) cur = cur[Number(p)];
      else throw new StepError(`${path}: nothing at ${JSON.stringify(p)}`);
    }
    return cur;
  }

  resolve(v, now) {
    const sp = special(v);
    if (sp) {
      const [op, arg] = sp;
      if (op === "$") return this.variable(arg);
      if (op === "$t") return this.start + arg;
      if (op === "$now") return now + arg;
      if (op === "$file") return this.vector(arg).toString("utf8");
      throw new StepError(`${op} is not allowed in an input`);
    }
    if (Array.isArray(v)) return v.map((x) => this.resolve(x, now));
    if (v && typeof v === "object") return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, this.resolve(x, now)]));
    return v;
  }

  /** A step's policy as an object of policy-input overrides: a name from `policies`, an object, or null. */
  policy(v) {
    let overrides = {};
    if (typeof v === "string") {
      overrides = (this.scenario.policies ?? {})[v];
      if (!overrides) throw new StepError(`no policy named ${v}`);
    } else if (v) overrides = v;
    policyRecord(overrides); // refuse an unknown field here, in every runner alike
    return overrides;
  }

  execute() {
    const agent = this.agent();
    this.scenario.steps.forEach((step, i) => this.step(agent, step, String(i + 1)));
    if (this.storage.race) {
      this.storage.race = null;
      this.fail("end", "a race was armed but no commit followed");
    }
  }

  step(agent, step, label) {
    const now = this.now;
    const op = step.op ?? "";
    if (EXPORTS.includes(op) && !("expect" in step)) {
      this.fail(label, `${op}: a step that calls the component needs an "expect"`);
    }
    const [lb, eb] = [this.lookups.length, this.escalations.length];
    let result;
    try {
      result = this.exec(agent, op, step, label, now);
    } catch (e) {
      this.fail(label, `${op}: ${e instanceof StepError ? e.message : `trap: ${e && e.stack}`}`);
      return;
    }
    const lookups = this.lookups.slice(lb);
    const escalations = this.escalations.slice(eb);
    if (step.as) {
      this.vars.set(step.as, result);
      this.vars.set(`${step.as}:lookups`, lookups);
      this.vars.set(`${step.as}:escalations`, escalations);
    }
    const records = [];
    const errs = [];
    let checks = step.records ?? [];
    if (!Array.isArray(checks)) checks = [checks];
    for (const check of checks) {
      let scope = null;
      let key = null;
      try {
        scope = this.resolve(this.dflt(check, "scope"), now);
        key = this.resolve(check.key ?? null, now);
      } catch (e) {
        if (!(e instanceof StepError)) throw e;
      }
      if (typeof scope !== "string" || typeof key !== "string") {
        this.fail(label, `a record check needs a scope and a key: ${canonical(check)}`);
        continue;
      }
      const view = orTrap(() => this.ensureSettings(agent) ?? exportResult(() => agent.x.inspect(scope, key)));
      records.push(view);
      if (view && typeof view === "object" && "audit" in view) {
        const problem = auditInvariants(view);
        if (problem) this.fail(label, `record ${scope}/${key}: ${problem}`);
      }
      const pattern = Object.fromEntries(
        Object.entries(check).filter(([k]) => !["scope", "key", "exists", "kinds"].includes(k)),
      );
      if (check.exists === false) {
        if (view !== null) this.fail(label, `record ${scope}/${key} should not exist, got ${canonical(view)}`);
        continue;
      }
      if (view === null || isError(view)) {
        this.fail(label, `record ${scope}/${key}: expected a record, got ${canonical(view)}`);
        continue;
      }
      if (!Array.isArray(view.audit)) {
        this.fail(label, `record ${scope}/${key}: expected a record, got ${canonical(view)}`);
        continue;
      }
      this.match(pattern, view, `record ${scope}/${key}`, now, errs);
      if ("kinds" in check) {
        this.match(check.kinds, view.audit.map((e) => e.kind), `record ${scope}/${key} kinds`, now, errs);
      }
    }
    const [n, events] = this.storage.inner.counts();
    // `quota` counts buckets: the ledger's provider-key secret shares the table, in scope "" (README).
    if (this.storage.inner.get("quota", "", SECRET_KEY)) n.quota -= 1;
    const store = { ...n, events };
    if ("expect" in step) this.match(step.expect, result, "result", now, errs);
    if ("lookups" in step) this.match(step.lookups, lookups, "lookups", now, errs);
    if ("escalations" in step) this.match(step.escalations, escalations, "escalations", now, errs);
    if ("store" in step) this.match(step.store, store, "store", now, errs);
    for (const e of errs) this.fail(label, e);
    this.transcript.push(
      canonical({ scenario: this.name, step: label, op, result, lookups, escalations, records, store }),
    );
  }

  exec(agent, op, step, label, now) {
    const inp = (field) => this.resolve(this.dflt(step, field), now);
    switch (op) {
      case "advance": {
        const ms = inp("ms");
        if (!Number.isInteger(ms)) throw new StepError(`ms: expected an integer, got ${canonical(ms)}`);
        if (!Number.isSafeInteger(this.now + ms) || this.now + ms < 0) {
          throw new StepError(`advance ${ms} from ${this.now} leaves the clock's range`);
        }
        this.now += ms;
        return null;
      }
      case "lookup":
        for (const e of inp("evidence")) {
          const [tag, val] = caseOf(e);
          if (!["confirmed", "absent", "unknown"].includes(tag)) throw new StepError(`evidence ${tag}`);
          this.evidence.push({ tag, val: tag === "absent" ? BigInt(val) : val });
        }
        return null;
      case "fail-commits":
        this.storage.failCommits = inp("n");
        return null;
      case "lose-commit-replies":
        this.storage.loseReplies = inp("n");
        return null;
      case "fail-reads":
        this.storage.failReads = Boolean(inp("on"));
        return null;
      case "ack-escalations":
        this.ack = Boolean(inp("ack"));
        return null;
      case "settings":
        Run.setSettings(this.settings, inp("set"));
        return null;
      case "wipe-ledger":
        this.storage.wipe();
        return null;
      case "race": {
        const steps = step.steps;
        this.storage.race = () => {
          this.other ??= this.agent();
          steps.forEach((inner, i) => this.step(this.other, inner, `${label}.${i + 1}`));
        };
        return null;
      }
      default:
        return this.call(agent, op, step, now);
    }
  }

  /** A start or begin step's `call`, its fields checked as jco checks the typed record's. */
  callOf(step, now) {
    const inp = (field) => this.resolve(this.dflt(step, field), now);
    const text = (v, what) => {
      if (typeof v !== "string") throw new StepError(`${what}: expected a string, got ${canonical(v)}`);
      return v;
    };
    let keys;
    if ("keys" in step) {
      const pairs = this.resolve(step.keys, now);
      if (!Array.isArray(pairs)) throw new StepError("keys: expected a list of [carrier, key]");
      keys = pairs.map((pair) => {
        if (!Array.isArray(pair) || pair.length !== 2) throw new StepError(`keys: expected [carrier, key], got ${canonical(pair)}`);
        return [text(pair[0], "carrier"), text(pair[1], "key")];
      });
    } else {
      const key = inp("key");
      keys = key === null ? [] : [["api", text(key, "key")]];
    }
    const supersedes = inp("supersedes");
    return {
      scope: text(inp("scope"), "scope"),
      keys,
      tool: text(inp("tool"), "tool"),
      args: text(inp("args"), "args"),
      supersedes: supersedes === null ? undefined : text(supersedes, "supersedes"),
      acknowledgeConfirmed: Boolean(inp("acknowledge-confirmed")),
    };
  }

  /** The JSON form of a start step's `call`. */
  callJson(step, now) {
    const c = this.callOf(step, now);
    return JSON.stringify({
      scope: c.scope,
      keys: c.keys,
      tool: c.tool,
      args: c.args,
      supersedes: c.supersedes ?? null,
      acknowledge_confirmed: c.acknowledgeConfirmed,
    });
  }

  /** A step that calls an export; the instance is configured first as the step needs (a refusal is its result). */
  call(agent, op, step, now) {
    const inp = (field) => this.resolve(this.dflt(step, field), now);
    let refused = null;
    if (op === "begin" || op === "start") {
      refused = this.ensureTool(agent, inp("tool"), this.policy(inp("policy")), inp("descriptor"));
    } else if (op !== "configure") {
      if (!EXPORTS.includes(op)) throw new StepError(`unknown op ${JSON.stringify(op)}`);
      refused = this.ensureSettings(agent);
    }
    if (refused !== null) return refused;
    const x = agent.x;
    const outcome = (name) => {
      const [tag, val] = caseOf(inp("outcome"));
      if (!["success", "rejected", "ambiguous", "not-sent"].includes(tag)) throw new StepError(`outcome ${tag}`);
      if (tag !== "not-sent" && typeof val !== "string") throw new StepError(`outcome ${tag}: expected a string, got ${canonical(val)}`);
      // `report` takes the JSON form of an `outcome`, `finish` the typed one.
      if (name === "report") return JSON.stringify(tag === "not-sent" ? "NotSent" : { [formCase(tag)]: val });
      return tag === "not-sent" ? { tag } : { tag, val };
    };
    switch (op) {
      case "configure": {
        const settings = { ...this.settings };
        Run.setSettings(settings, inp("settings"));
        const tools = (step.tools ?? []).map((t) => ({
          tool: "tool" in t ? t.tool : inp("tool"),
          policy: this.policy(t.policy ?? null),
          descriptor: this.resolve(t.descriptor ?? null, now),
        }));
        return agent.configure({ settings, defaults: this.policy(step.defaults ?? null), tools });
      }
      case "begin":
        return exportResult(() => x.begin(this.callOf(step, now)));
      // A typed run drives the call with the typed `driver` (as the npm package does), a ledger-json run
      // with `protocol`'s JSON form (as the Python package does): both encodings of one protocol.
      case "start":
        if (this.encoding === "typed") return exportResult(() => x.driver.start(this.callOf(step, now)));
        return stepAnswer(() => x.start(this.callJson(step, now)));
      case "finish":
        return exportResult(() => x.finish(inp("scope"), inp("key"), inp("fence"), outcome("finish")));
      case "report":
        if (this.encoding === "typed") return exportResult(() => x.driver.report(inp("scope"), inp("key"), inp("fence"), outcome("finish")));
        return stepAnswer(() => x.report(inp("scope"), inp("key"), inp("fence"), outcome("report")));
      case "resume":
        if (this.encoding === "typed") return exportResult(() => x.driver.resume(inp("scope"), inp("key")));
        return stepAnswer(() => x.resume(inp("scope"), inp("key")));
      case "reconcile":
        return exportResult(() => x.reconcile(inp("scope"), inp("key")));
      case "await-holder":
        return exportResult(() => x.awaitHolder(inp("scope"), inp("key")));
      case "sweep":
        return exportResult(() => x.sweep(inp("limit") ?? 100, Boolean(inp("dispatch"))));
      case "prune":
        return exportResult(() => x.prune(inp("limit") ?? 100));
      case "inspect":
        return exportResult(() => x.inspect(inp("scope"), inp("key")));
      case "resolve": {
        const [tag, val] = caseOf(inp("resolution"));
        if (!["confirmed", "absent", "approve", "deny"].includes(tag)) throw new StepError(`resolution ${tag}`);
        const resolution = tag === "confirmed" ? { tag, val } : { tag };
        return exportResult(() => x.resolve(inp("scope"), inp("key"), resolution, inp("note"), Boolean(inp("force"))));
      }
      case "canonicalize": {
        let data;
        if ("text" in step) data = new TextEncoder().encode(this.resolve(step.text, now));
        else if ("hex" in step) data = hexBytes(step.hex);
        else if ("file" in step) data = new Uint8Array(this.vector(step.file));
        else throw new StepError("canonicalize needs text, hex or file");
        return exportResult(() => x.canonicalize(data));
      }
      case "fingerprint":
        return exportResult(() => x.fingerprint(inp("tool"), inp("args")));
      default:
        throw new StepError(`unknown op ${JSON.stringify(op)}`);
    }
  }

  match(pattern, actual, path, now, errs) {
    const sp = special(pattern);
    if (sp) {
      const [op, arg] = sp;
      const want = (value) => {
        if (!deepEqual(value, actual)) errs.push(`${path}: expected ${canonical(value)}, got ${canonical(actual)}`);
      };
      try {
        switch (op) {
          case "$":
            return want(this.variable(arg));
          case "$t":
            return want(this.start + arg);
          case "$now":
            return want(now + arg);
          case "$file":
            return want(this.vector(arg).toString("utf8"));
          case "$hexfile":
            return want(Buffer.from(hexBytes(this.vector(arg).toString("utf8"))).toString("utf8"));
          case "$csv":
            return want(this.csv(arg[0], arg[1]));
        }
      } catch (e) {
        errs.push(`${path}: ${e.message}`);
        return;
      }
      const ok = (p, x) => {
        const inner = [];
        this.match(p, x, path, now, inner);
        return inner.length === 0;
      };
      switch (op) {
        case "$not":
          if (ok(arg, actual)) errs.push(`${path}: ${canonical(actual)} should not match ${canonical(arg)}`);
          break;
        case "$contains":
          if (!(typeof actual === "string" && actual.includes(arg)))
            errs.push(`${path}: ${canonical(actual)} does not contain ${canonical(arg)}`);
          break;
        case "$nonempty":
          if (!(typeof actual === "string" && actual.length > 0))
            errs.push(`${path}: expected a non-empty string, got ${canonical(actual)}`);
          break;
        case "$json": {
          let parsed;
          try {
            parsed = JSON.parse(actual);
          } catch {
            errs.push(`${path}: expected JSON text, got ${canonical(actual)}`);
            break;
          }
          this.match(arg, parsed, `${path} (JSON)`, now, errs);
          break;
        }
        case "$len":
          if (!(Array.isArray(actual) && actual.length === arg))
            errs.push(`${path}: expected ${arg} elements, got ${canonical(actual)}`);
          break;
        case "$has":
          if (!(Array.isArray(actual) && actual.some((x) => ok(arg, x))))
            errs.push(`${path}: no element matches ${canonical(arg)} in ${canonical(actual)}`);
          break;
        case "$count": {
          const n = Array.isArray(actual) ? actual.filter((x) => ok(arg[0], x)).length : 0;
          if (n !== arg[1]) errs.push(`${path}: ${n} elements match ${canonical(arg[0])}, expected ${arg[1]}`);
          break;
        }
        case "$tail":
          if (Array.isArray(actual) && actual.length >= arg.length) this.match(arg, actual.slice(actual.length - arg.length), path, now, errs);
          else errs.push(`${path}: ${canonical(actual)} does not end with ${canonical(arg)}`);
          break;
        case "$gt":
        case "$ge":
        case "$lt":
        case "$le": {
          let bound;
          try {
            bound = this.resolve(arg, now);
          } catch (e) {
            errs.push(`${path}: ${e.message}`);
            break;
          }
          const cmp = { $gt: (a, b) => a > b, $ge: (a, b) => a >= b, $lt: (a, b) => a < b, $le: (a, b) => a <= b }[op];
          if (!(Number.isInteger(actual) && cmp(actual, bound)))
            errs.push(`${path}: ${canonical(actual)} is not ${op} ${canonical(arg)}`);
          break;
        }
        default:
          errs.push(`${path}: unknown matcher ${op}`);
      }
      return;
    }
    const isObj = (x) => x !== null && typeof x === "object" && !Array.isArray(x);
    if (isObj(pattern) && isObj(actual)) {
      for (const [k, pv] of Object.entries(pattern)) {
        if (!(k in actual)) errs.push(`${path}: no field ${JSON.stringify(k)} in ${canonical(actual)}`);
        else this.match(pv, actual[k], `${path}/${k}`, now, errs);
      }
    } else if (Array.isArray(pattern) && Array.isArray(actual)) {
      if (pattern.length !== actual.length) {
        errs.push(`${path}: expected ${pattern.length} elements, got ${actual.length}: ${canonical(actual)}`);
        return;
      }
      pattern.forEach((pv, i) => this.match(pv, actual[i], `${path}/${i}`, now, errs));
    } else if (!deepEqual(pattern, actual)) {
      errs.push(`${path}: expected ${canonical(pattern)}, got ${canonical(actual)}`);
    }
  }
}

function orTrap(f) {
  try {
    return f();
  } catch (e) {
    return { trap: String(e) };
  }
}

function auditInvariants(view) {
  const audit = view.audit;
  if (audit.length === 0) return "a record without an audit event";
  const last = audit[audit.length - 1];
  if (last.version !== view.version) return `last audit version ${last.version} != record version ${view.version}`;
  if (last["to-state"] !== view.state) return `last audit event ends in ${last["to-state"]}, the record is ${view.state}`;
  for (let i = 1; i < audit.length; i++) if (audit[i].version <= audit[i - 1].version) return "audit versions do not rise";
  return null;
}

// ---------------------------------------------------------------- main

function parseArgs(argv) {
  const a = {
    scenarios: join(REPO, "tests", "conformance", "scenarios"),
    vectors: process.env.ONCE_VECTORS ?? join(REPO, "..", "shared", "vectors", "jcs"),
    store: "all",
    filter: "",
    negative: false,
  };
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i];
    if (flag === "--negative") a.negative = true;
    else if (["--component", "--scenarios", "--vectors", "--store", "--transcripts", "--filter", "--stores"].includes(flag)) a[flag.slice(2)] = argv[++i];
    else throw new Error(`unknown argument ${flag}`);
  }
  if (!a.component) throw new Error("--component is required");
  return a;
}

function loadScenarios(dir, filter) {
  return readdirSync(dir)
    .filter((f) => f.endsWith(".json"))
    .sort()
    .map((f) => {
      const scenario = JSON.parse(readFileSync(join(dir, f), "utf8"));
      const stem = f.slice(0, -5);
      if (scenario.name !== stem) throw new Error(`${f}: "name" must be the file name`);
      return [stem, scenario];
    })
    .filter(([stem]) => stem.includes(filter));
}

// The deliberately broken stores, and the scenarios that must catch each.
const NEGATIVE = {
  "cas-ignores-version": ["race-quota-reservations"],
  "no-conflicts": [
    "race-concurrent-begins",
    "race-concurrent-starts",
    "race-quota-reservations",
    "race-finish-vs-sweep",
    "race-original-retried-while-superseded",
  ],
};

function runAll(runtime, vectors, scenarios, kind, encoding, broken) {
  return scenarios.map(([name, scenario]) => {
    const dir = mkdtempSync(join(tmpdir(), "once-conf-"));
    try {
      const run = new Run(runtime, vectors, name, scenario, kind, encoding, dir, broken);
      run.execute();
      if (run.storage.inner.close) run.storage.inner.close();
      return [name, run.transcript, run.failures];
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
}

async function main() {
  const a = parseArgs(process.argv.slice(2));
  if (a.stores) STORES = (await import(pathToFileURL(resolve(a.stores)).href)).stores;
  const started = Date.now();
  const digest = createHash("sha256").update(readFileSync(a.component)).digest("hex");
  const runtime = await loadRuntime(a.component);
  console.log(`node ${process.version}: component ${a.component} sha256 ${digest}`);
  const scenarios = loadScenarios(a.scenarios, a.filter);
  if (scenarios.length === 0) {
    console.log("node: no scenarios found");
    return 1;
  }
  let passed = 0;
  let failed = 0;
  // Every store on the typed ledger (the encoding the npm package answers); memory on ledger-json too.
  const runs = (a.store === "all" ? ["memory", "sqlite"] : [a.store]).map((kind) => [kind, "typed", kind]);
  if (a.store === "all" || a.store === "memory") runs.push(["memory", "json", "memory-json"]);
  for (const [kind, encoding, label] of runs) {
    const results = runAll(runtime, a.vectors, scenarios, kind, encoding, null);
    const bad = results.filter(([, , f]) => f.length > 0);
    for (const [, , failures] of bad) for (const line of failures) console.log(`  FAIL ${line}`);
    console.log(`node (${kind}, ${encoding}): ${results.length - bad.length} passed, ${bad.length} failed`);
    passed += results.length - bad.length;
    failed += bad.length;
    if (a.transcripts) {
      mkdirSync(a.transcripts, { recursive: true });
      const text = results.map(([, lines]) => lines.map((l) => `${l}\n`).join("")).join("");
      writeFileSync(join(a.transcripts, `node-${label}.jsonl`), text);
    }
  }
  if (a.negative) {
    const names = new Set(scenarios.map(([n]) => n));
    for (const [broken, must] of Object.entries(NEGATIVE)) {
      const results = runAll(runtime, a.vectors, scenarios, "memory", "typed", broken);
      const caught = results.filter(([, , f]) => f.length > 0).map(([n]) => n);
      const missed = must.filter((m) => names.has(m) && !caught.includes(m));
      if (missed.length > 0 || caught.length === 0) {
        console.log(`node negative (${broken}): went unnoticed by ${missed.join(", ") || "every scenario"}`);
        failed += 1;
      } else {
        console.log(`node negative (${broken}): caught by ${caught.length} scenario(s): ${caught.join(", ")}`);
        passed += 1;
      }
    }
  }
  rmSync(runtime.dir, { recursive: true, force: true });
  console.log(`node: ${passed} passed, ${failed} failed in ${((Date.now() - started) / 1000).toFixed(1)} s`);
  return failed === 0 && passed > 0 ? 0 : 1;
}

process.exitCode = await main();
