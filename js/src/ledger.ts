// The `ledger` import over a synchronous store: `get` and `commit` in the JSON
// form (wire.ts), `scan` and `audit` typed. A store's throw is the store's
// failure, in its words; a batch that is not the JSON form is refused whole.
import type { SyncStore } from "./stores/store.js";
import { APPLIED, CONFLICT, MISSING, batchOf, failedText, gotText } from "./wire.js";
import type { Audited, Scanned, State, Table } from "./wit.js";

const message = (e: unknown) => (e instanceof Error ? e.message : String(e));

/** The `once:core/ledger` interface over `store`. */
export function ledgerImports(store: SyncStore) {
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
