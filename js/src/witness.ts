// The witness import (wit/once.wit `witness`) over a synchronous store: a copy of the record of every attempt
// the engine hands out, kept where a restore of the ledger does not reach (docs/design.md "Older history").
// The guest decides what to keep, when, and what a kept record means; this host only stores the text. A
// store's throw is the witness's failure, in its words: `seen` answers `failed`, `keep` and `forget` the words.
import type { SyncStore } from "./stores/store.js";
import type { Witnessed } from "./wit.js";

const message = (e: unknown) => (e instanceof Error ? e.message : String(e));

/** What of a store the witness import needs. */
export type WitnessStore = Pick<SyncStore, "witnessSeen" | "witnessKeep" | "witnessForget">;

/** The `once:core/witness` interface over `store`. */
export function witnessImports(store: WitnessStore) {
  return {
    seen(scope: string, key: string): Witnessed {
      try {
        const body = store.witnessSeen(scope, key);
        return body === undefined ? { tag: "nothing" } : { tag: "kept", val: body };
      } catch (e) {
        return { tag: "failed", val: message(e) };
      }
    },
    /** Undefined (WIT `none`) once kept durably, or when what is kept was granted later; else why not. */
    keep(scope: string, key: string, body: string, at: bigint): string | undefined {
      try {
        store.witnessKeep(scope, key, body, at);
        return undefined;
      } catch (e) {
        return message(e);
      }
    },
    /** Undefined (WIT `none`) once what (scope, key) kept before `before` is forgotten; else why not. */
    forget(scope: string, key: string, before: bigint): string | undefined {
      try {
        store.witnessForget(scope, key, before);
        return undefined;
      } catch (e) {
        return message(e);
      }
    },
  };
}
