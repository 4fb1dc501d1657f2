// The ledger imports over a synchronous store, in WIT types: this host configures
// `ledger-encoding` typed (jco lifts a typed batch no slower than it passes the
// JSON form, and the package needs no codec for it). A store's throw is the
// store's failure, in its words.
import type { SyncStore } from "./stores/store.js";
import type { Audited, Batch, Committed, Got, Scanned, State, Table } from "./wit.js";

const message = (e: unknown) => (e instanceof Error ? e.message : String(e));

/** A store's failure, as `got.failed`, `committed.failed`, `scanned.failed` or `audited.failed`. */
const failed = (why: string) => ({ tag: "failed" as const, val: { message: why } });

/** The first written row that names another table, scope or key than its put: a batch no store may apply. */
function misplaced(batch: Batch): string | undefined {
  const i = batch.puts.findIndex((p) => p.row !== undefined && (p.row.table !== p.table || p.row.scope !== p.scope || p.row.key !== p.key));
  return i < 0 ? undefined : `ledger.commit: puts/${i}: the row is not the put's (table, scope and key must match)`;
}

/** The `once:core/ledger` interface over `store`. */
export function ledgerImports(store: SyncStore) {
  return {
    get(table: Table, scope: string, key: string): Got {
      try {
        const row = store.get(table, scope, key);
        return row === undefined ? { tag: "missing" } : { tag: "found", val: { version: row.version, body: row.body } };
      } catch (e) {
        return failed(message(e));
      }
    },
    commit(batch: Batch): Committed {
      const wrong = misplaced(batch);
      if (wrong !== undefined) return failed(wrong);
      try {
        return store.commit(batch);
      } catch (e) {
        return failed(message(e));
      }
    },
    scan(table: Table, states: State[], dueBefore: bigint, owner: string | undefined, limit: number): Scanned {
      try {
        return { tag: "found", val: { rows: store.scan(table, states, dueBefore, owner, limit) } };
      } catch (e) {
        return failed(message(e));
      }
    },
    audit(scope: string, key: string): Audited {
      try {
        return { tag: "found", val: { events: store.audit(scope, key) } };
      } catch (e) {
        return failed(message(e));
      }
    },
  };
}

/**
 * The `once:core/ledger-json` interface: configured with `ledger-encoding` typed, the guest never calls it,
 * and it answers `failed` (in the JSON form), as the other encoding's imports must (wit/once.wit).
 */
export const ledgerJsonImports = () => {
  const typedOnly = () => JSON.stringify({ Failed: { message: "this host answers get and commit in the typed ledger only" } });
  return { get: typedOnly, commit: typedOnly };
};
