// The in-memory ledger: one Map of rows and one of audit events, in the engine's worker.
import type { AuditEvent, Batch, Row, State, Table } from "../wit.js";
import { type CommitVerdict, type Counts, type SyncStore, nextBodyFormat, utf8cmp } from "./store.js";

const rowKey = (t: string, s: string, k: string) => JSON.stringify([t, s, k]);
const eventKey = (s: string, k: string, v: bigint) => JSON.stringify([s, k, String(v)]);

/**
 * A witness in memory: what `keep` was given, per (scope, key), with the `at` it was granted at. Exact for a
 * ledger in memory, which no backup is restored over: it lives and dies with the rows it witnesses.
 */
export class MemoryWitness {
  private kept = new Map<string, { at: bigint; body: string }>();

  /** The body kept for (scope, key), or undefined. */
  seen(scope: string, key: string): string | undefined {
    return this.kept.get(JSON.stringify([scope, key]))?.body;
  }

  /** Keep `body` unless what is kept was granted later (the SQLite witness's `WHERE excluded.at >= witness.at`). */
  keep(scope: string, key: string, body: string, at: bigint): void {
    const k = JSON.stringify([scope, key]);
    const current = this.kept.get(k);
    if (current === undefined || at >= current.at) this.kept.set(k, { at, body });
  }

  /** Forget what is kept for (scope, key) if it was kept before `before`. */
  forget(scope: string, key: string, before: bigint): void {
    const k = JSON.stringify([scope, key]);
    const current = this.kept.get(k);
    if (current !== undefined && current.at < before) this.kept.delete(k);
  }
}

/** Rows and events in memory: gone with the process (tests, prototypes). */
export class MemoryStore implements SyncStore {
  private rows = new Map<string, Row>();
  private events = new Map<string, AuditEvent>();
  private witness = new MemoryWitness();
  /** Recorded by the first engine: handles sharing one store must agree, as on a file. */
  private bodyFormat: string | undefined;

  claimBodyFormat(format: number): void {
    const next = nextBodyFormat("(in memory)", this.bodyFormat, format);
    if (next !== undefined) this.bodyFormat = String(next);
  }

  get(table: Table, scope: string, key: string): Row | undefined {
    const r = this.rows.get(rowKey(table, scope, key));
    return r && { ...r };
  }

  commit(batch: Batch): CommitVerdict {
    const staged = new Map<string, Row | undefined>();
    for (const p of batch.puts) {
      const k = rowKey(p.table, p.scope, p.key);
      const current = staged.has(k) ? staged.get(k) : this.rows.get(k);
      if (current?.version !== p.expected) return { tag: "conflict" };
      staged.set(k, p.row);
    }
    const fresh = new Map<string, AuditEvent>();
    for (const e of batch.events) {
      const k = eventKey(e.scope, e.key, e.version);
      if (this.events.has(k) || fresh.has(k)) return { tag: "conflict" };
      fresh.set(k, e);
    }
    for (const [k, row] of staged) {
      if (row === undefined) this.rows.delete(k);
      else this.rows.set(k, { ...row });
    }
    for (const [k, e] of fresh) this.events.set(k, { ...e });
    return { tag: "applied" };
  }

  scan(table: Table, states: State[], dueBefore: bigint, owner: string | undefined, limit: number): Row[] {
    const rows = [...this.rows.values()].filter(
      (r) =>
        r.table === table &&
        r.dueAt !== undefined &&
        r.dueAt <= dueBefore &&
        (states.length === 0 || (r.state !== undefined && states.includes(r.state))) &&
        (owner === undefined || r.owner === owner),
    );
    rows.sort(
      (a, b) =>
        (a.dueAt! < b.dueAt! ? -1 : a.dueAt! > b.dueAt! ? 1 : 0) || utf8cmp(a.scope, b.scope) || utf8cmp(a.key, b.key),
    );
    return rows.slice(0, limit).map((r) => ({ ...r }));
  }

  audit(scope: string, key: string): AuditEvent[] {
    return [...this.events.values()]
      .filter((e) => e.scope === scope && e.key === key)
      .sort((a, b) => (a.version < b.version ? -1 : 1))
      .map((e) => ({ ...e }));
  }

  counts(): Counts {
    const n: Counts = { operation: 0, tombstone: 0, quota: 0, events: this.events.size };
    for (const r of this.rows.values()) n[r.table] += 1;
    return n;
  }

  witnessSeen(scope: string, key: string): string | undefined {
    return this.witness.seen(scope, key);
  }

  witnessKeep(scope: string, key: string, body: string, at: bigint): void {
    this.witness.keep(scope, key, body, at);
  }

  witnessForget(scope: string, key: string, before: bigint): void {
    this.witness.forget(scope, key, before);
  }

  close(): void {}
}
