// The record store a ledger import needs, in jco's shapes: rows and events as the
// guest hands them over (u64 as bigint, unset options as undefined).
import type { AuditEvent, Batch, Row, State, Table } from "../wit.js";

/** What a commit did: applied, a version/event conflict (nothing applied), or a failure in the store's words. */
export type CommitVerdict = { tag: "applied" } | { tag: "conflict" } | { tag: "failed"; val: { message: string } };

/** A synchronous compare-and-swap store of the engine's rows and audit trail (runs in the engine's worker). */
export interface SyncStore {
  get(table: Table, scope: string, key: string): Row | undefined;
  commit(batch: Batch): CommitVerdict;
  scan(table: Table, states: State[], dueBefore: bigint, owner: string | undefined, limit: number): Row[];
  audit(scope: string, key: string): AuditEvent[];
  /** Rows per table and the number of audit events (operators' statistics, tests). */
  counts(): Counts;
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
