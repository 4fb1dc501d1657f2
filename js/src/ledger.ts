// The ledger imports over a synchronous store: `get` and `commit` in the JSON
// form (wire.ts, `ledger-json`: this host configures `ledger-encoding` json),
// `scan` and `audit` typed. A store's throw is the store's failure, in its
// words; a batch that is not the JSON form is refused whole.
import type { SyncStore } from "./stores/store.js";
import { APPLIED, CONFLICT, MISSING, batchOf, failedText, gotText } from "./wire.js";
import type { Audited, Committed, Got, Scanned, State, Table } from "./wit.js";

const message = (e: unknown) => (e instanceof Error ? e.message : String(e));

/** The `once:core/ledger-json` interface over `store`: `get` and `commit` as JSON text. */
export function ledgerJsonImports(store: SyncStore) {
  return {
    get(table: Table, scope: string, key: string): string {
      try {
        const row = store.get(table, scope, key);
        return row === undefined ? MISSING : gotText(row.version, row.body);
      } catch (e) {
        return failedText(message(e));
      }
    },
    commit(batch: string, bodies: string[]): string {
      try {
        const verdict = store.commit(batchOf(batch, bodies));
        switch (verdict.tag) {
          case "applied":
            return APPLIED;
          case "conflict":
            return CONFLICT;
          case "failed":
            return failedText(verdict.val.message);
        }
      } catch (e) {
        return failedText(message(e));
      }
    },
  };
}

/**
 * The `once:core/ledger` interface over `store`: `scan` and `audit`. Its typed `get` and `commit` answer
 * `failed`: configured with `ledger-encoding` json, the guest calls `ledger-json`'s instead.
 */
export function ledgerImports(store: SyncStore) {
  const jsonOnly = (): Got & Committed => ({
    tag: "failed",
    val: { message: "this host answers get and commit in ledger-json only" },
  });
  return {
    get: jsonOnly,
    commit: jsonOnly,
    scan(table: Table, states: State[], dueBefore: bigint, owner: string | undefined, limit: number): Scanned {
      try {
        return { tag: "found", val: { rows: store.scan(table, states, dueBefore, owner, limit) } };
      } catch (e) {
        return { tag: "failed", val: { message: message(e) } };
      }
    },
    audit(scope: string, key: string): Audited {
      try {
        return { tag: "found", val: { events: store.audit(scope, key) } };
      } catch (e) {
        return { tag: "failed", val: { message: message(e) } };
      }
    },
  };
}
