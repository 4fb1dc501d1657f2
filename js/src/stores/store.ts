// The record store a ledger import needs, in jco's shapes: rows and events as the
// guest hands them over (u64 as bigint, unset options as undefined).
import type { AuditEvent, Batch, Row, State, Table } from "../wit.js";

/** What a commit did: applied, a version/event conflict (nothing applied), or a failure in the store's words. */
export type CommitVerdict = { tag: "applied" } | { tag: "conflict" } | { tag: "failed"; val: { message: string } };

/** A synchronous compare-and-swap store of the engine's rows and audit trail (runs in the engine's worker). */
export interface SyncStore {
  get(table: Table, scope: string, key: string): Row | undefined;
  /**
   * Apply every put and event of `batch`, or none. A batch the engine marks `deferrable` may be committed
   * without waiting for the disk by a store in an intent-only mode (SQLite's `intent-only`); every other
   * store commits it as any batch.
   */
  commit(batch: Batch): CommitVerdict;
  scan(table: Table, states: State[], dueBefore: bigint, owner: string | undefined, limit: number): Row[];
  audit(scope: string, key: string): AuditEvent[];
  /**
   * Settle the ledger's body format with an engine that writes `format` (and reads every earlier one), before
   * it reads or writes a row: record it if none or an earlier one is recorded; throw (`nextBodyFormat`'s
   * refusal), writing nothing, if a later one is. Atomic: read and written in one transaction.
   */
  claimBodyFormat(format: number): void;
  /** Rows per table and the number of audit events (operators' statistics, tests). */
  counts(): Counts;
  /**
   * The witness (wit/once.wit `witness`): the record body kept for (scope, key) outside the ledger, or undefined
   * when none is kept. Throws when the witness cannot be read (the import answers `failed` with the words).
   */
  witnessSeen(scope: string, key: string): string | undefined;
  /**
   * Keep `body` for (scope, key), granted at `at`, in place of what is kept, unless what is kept has a greater
   * `at`; durable when it returns. Throws why it could not.
   */
  witnessKeep(scope: string, key: string, body: string, at: bigint): void;
  /** Forget what is kept for (scope, key) if its `at` is before `before`. Throws why it could not. */
  witnessForget(scope: string, key: string, before: bigint): void;
  close(): void;
}

/** Rows per table and audit events. */
export interface Counts {
  operation: number;
  tombstone: number;
  quota: number;
  events: number;
}

/** The largest integer SQL stores hold: every stored version and timestamp fits. */
export const I64_MAX = (1n << 63n) - 1n;

/** Byte order of UTF-8 strings (what SQLite's BINARY and PostgreSQL's "C" collation sort by). */
export const utf8cmp = (a: string, b: string): number => Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8"));

/** Refuse a u64 a signed 64-bit column cannot hold, as the Rust stores do. */
export function int(backend: string, what: string, v: bigint): bigint {
  if (v > I64_MAX) throw new Error(`${backend}: ${what} ${v} exceeds i64::MAX`);
  return v;
}

/**
 * How durable a commit is when it returns: `full` survives power loss (the default); `normal` may lose the
 * last commits then; `intent-only` is `full` for every batch but the ones the engine marks deferrable.
 */
export type Synchronous = "full" | "intent-only" | "normal";

/** Per SQLite mode: the `PRAGMA synchronous` of an ordinary commit, and of one the engine marked deferrable. */
export const SYNCHRONOUS_LEVELS: Record<Synchronous, readonly [string, string]> = {
  full: ["FULL", "FULL"],
  "intent-only": ["FULL", "NORMAL"],
  normal: ["NORMAL", "NORMAL"],
};

/** A mode as given (any case, `_` for `-`), or an Error naming the modes. */
export function synchronousMode(given: unknown): Synchronous {
  const mode = typeof given === "string" ? given.toLowerCase().replace(/_/g, "-") : "";
  if (!Object.prototype.hasOwnProperty.call(SYNCHRONOUS_LEVELS, mode)) {
    throw new Error(`synchronous must be "full", "intent-only" or "normal", not ${JSON.stringify(given) ?? String(given)}`);
  }
  return mode as Synchronous;
}

/** The `meta` key under which a ledger records the format of its row bodies (the guest's `body-format`). */
export const BODY_FORMAT_KEY = "body_format";

/** The format of a ledger that records none: it predates the key, when every body was format 1. */
export const UNRECORDED_BODY_FORMAT = 1;

/**
 * What a ledger's recorded body format must become before an engine that writes `format` (and reads every
 * earlier one) uses it: the value to write (none recorded yet: the ledger holds format 1; or an earlier
 * one), or undefined when it already says `format`. A later format is refused with an Error naming the
 * ledger and both formats (the Rust host's words). Stores call this inside the write transaction that reads
 * the value and writes the answer.
 */
export function nextBodyFormat(ledger: string, stored: string | undefined, format: number): number | undefined {
  let holds = UNRECORDED_BODY_FORMAT;
  if (stored !== undefined) {
    if (!/^[0-9]+$/.test(stored)) {
      throw new Error(`ledger ${ledger}: unreadable ${BODY_FORMAT_KEY} ${JSON.stringify(stored)} in its meta table (expected a number)`);
    }
    holds = Number(stored);
  }
  if (holds > format) {
    throw new Error(
      `ledger ${ledger} holds record bodies of format ${holds}; this build of once reads format ${format}: ` +
        `upgrade once (any build reading format ${holds})`,
    );
  }
  return stored === undefined || holds < format ? format : undefined;
}
