// The package's own ledgers (dist/stores) behind the conformance runner's store
// interface (tests/conformance/node/run.mjs --stores): neutral rows in, jco rows to the package's stores
// (the SQLite one in intent-only mode: the engine's deferrable batches at NORMAL, the rest at FULL).
import { MemoryStore } from "../dist/stores/memory.js";
import { SqliteStore } from "../dist/stores/sqlite.js";

const big = (v) => (v === null || v === undefined ? undefined : BigInt(v));
const jcoRow = (r) =>
  r && {
    table: r.table,
    scope: r.scope,
    key: r.key,
    version: BigInt(r.version),
    state: r.state ?? undefined,
    dueAt: big(r["due-at"]),
    owner: r.owner ?? undefined,
    body: r.body,
  };
const neutralRow = (r) =>
  r
    ? {
        table: r.table,
        scope: r.scope,
        key: r.key,
        version: Number(r.version),
        state: r.state ?? null,
        "due-at": r.dueAt ?? null,
        owner: r.owner ?? null,
        body: r.body,
      }
    : null;
const jcoEvent = (e) => ({
  scope: e.scope,
  key: e.key,
  version: BigInt(e.version),
  at: BigInt(e.at),
  kind: e.kind,
  fromState: e["from-state"] ?? undefined,
  toState: e["to-state"] ?? undefined,
  attempt: e.attempt ?? undefined,
  detail: e.detail,
});
const neutralEvent = (e) => ({
  scope: e.scope,
  key: e.key,
  version: Number(e.version),
  at: Number(e.at),
  kind: e.kind,
  "from-state": e.fromState ?? null,
  "to-state": e.toState ?? null,
  attempt: e.attempt ?? null,
  detail: e.detail,
});

class Neutral {
  constructor(inner) {
    this.inner = inner;
  }
  get(table, scope, key) {
    return neutralRow(this.inner.get(table, scope, key));
  }
  commit(puts, events, deferrable) {
    const verdict = this.inner.commit({
      puts: puts.map((p) => ({ table: p.table, scope: p.scope, key: p.key, expected: big(p.expected), row: jcoRow(p.row) ?? undefined })),
      events: events.map(jcoEvent),
      deferrable,
    });
    if (verdict.tag === "applied") return null;
    if (verdict.tag === "conflict") return "conflict";
    throw new Error(verdict.val.message);
  }
  scan(table, states, dueBefore, owner, limit) {
    return this.inner.scan(table, states, BigInt(dueBefore), owner ?? undefined, limit).map(neutralRow);
  }
  audit(scope, key) {
    return this.inner.audit(scope, key).map(neutralEvent);
  }
  counts() {
    const { events, ...rows } = this.inner.counts();
    return [rows, events];
  }
  close() {
    this.inner.close();
  }
}

export const stores = {
  memory: () => new Neutral(new MemoryStore()),
  sqlite: (path) => new Neutral(new SqliteStore({ path, synchronous: "intent-only" })),
};
