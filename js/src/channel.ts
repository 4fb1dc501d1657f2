// The messages between a Once handle (main thread) and its engine worker.
//
// The guest's imports are synchronous; the worker answers them from its own
// store (memory, SQLite) or, for what lives on the main thread (the
// application's lookups and escalation sink, a PostgreSQL pool), posts a
// request and blocks on a shared flag until the main thread has posted the
// answer on a second port, which it then reads synchronously.
import type { MessagePort } from "node:worker_threads";
import type { Batch, Escalation, State, Table } from "./wit.js";
import type { Synchronous } from "./stores/store.js";

/** Where the worker's ledger lives. */
export type StoreSpec =
  | { kind: "memory" }
  | { kind: "sqlite"; path: string; synchronous?: Synchronous; busyTimeoutMs?: number }
  /** Rows and clock are asked of the main thread (PostgreSQL). */
  | { kind: "remote" };

/** What the worker is started with. */
export interface WorkerInit {
  genDir: string;
  store: StoreSpec;
  /** Int32 flag the main thread sets (and notifies) once an import's answer is on `replies`. */
  flag: SharedArrayBuffer;
  replies: MessagePort;
}

/** An export call, main thread to worker. */
export interface Request {
  id: number;
  op: string;
  args: unknown[];
}

/** An export's answer: its value, the component's error payload, or a failure of the component itself; with the ledger clock read after it. */
export type Response = ({ id: number; value: unknown } | { id: number; error: unknown } | { id: number; trap: string }) & {
  now?: bigint;
};

/** An import the worker needs answered by the main thread. */
export type ImportRequest =
  | { kind: "lookup"; tool: string; providerKey: string; args: string; now: bigint }
  | { kind: "escalate"; escalation: Escalation }
  | { kind: "get"; table: Table; scope: string; key: string }
  | { kind: "commit"; batch: Batch }
  | { kind: "scan"; table: Table; states: State[]; dueBefore: bigint; owner: string | undefined; limit: number }
  | { kind: "audit"; scope: string; key: string }
  | { kind: "now" };

/** The main thread's answer to an import: a value, or a failure in words. */
export type ImportAnswer = { ok: unknown } | { failed: string };
