// The engine's worker thread: one instance of the guest component and the
// synchronous imports it calls. Export calls arrive one at a time from the
// Once handle; a trap discards the instance (the next call gets a fresh one,
// configured as the last accepted configuration), so no half-finished guest
// state is reused.
import { randomBytes } from "node:crypto";
import { parentPort, receiveMessageOnPort, workerData } from "node:worker_threads";
import type { ImportAnswer, ImportRequest, Request, Response, WorkerInit } from "./channel.js";
import { type Exports, loadComponent } from "./component.js";
import { ledgerImports, ledgerJsonImports } from "./ledger.js";
import { MemoryStore } from "./stores/memory.js";
import { SqliteStore } from "./stores/sqlite.js";
import type { SyncStore } from "./stores/store.js";
import { witnessImports } from "./witness.js";
import type { AuditEvent, Batch, Configuration, Escalation, Evidence, Row, State, Table } from "./wit.js";

const init = workerData as WorkerInit;
const flag = new Int32Array(init.flag);
const port = parentPort!;

/** Ask the main thread and block until it answered. */
function ask(request: ImportRequest): ImportAnswer {
  Atomics.store(flag, 0, 0);
  port.postMessage({ import: request });
  for (;;) {
    Atomics.wait(flag, 0, 0);
    const got = receiveMessageOnPort(init.replies);
    if (got) return got.message as ImportAnswer;
    Atomics.wait(flag, 0, 1, 1);
  }
}

function askOk<T>(request: ImportRequest): T {
  const answer = ask(request);
  if ("failed" in answer) throw new Error(answer.failed);
  return answer.ok as T;
}

/** The rows a remote (main-thread) store keeps, asked for one call at a time. */
class RemoteStore implements SyncStore {
  get(table: Table, scope: string, key: string): Row | undefined {
    return askOk<Row | undefined>({ kind: "get", table, scope, key });
  }
  commit(batch: Batch) {
    const answer = ask({ kind: "commit", batch });
    return "failed" in answer
      ? { tag: "failed" as const, val: { message: answer.failed } }
      : (answer.ok as ReturnType<SyncStore["commit"]>);
  }
  scan(table: Table, states: State[], dueBefore: bigint, owner: string | undefined, limit: number): Row[] {
    return askOk<Row[]>({ kind: "scan", table, states, dueBefore, owner, limit });
  }
  audit(scope: string, key: string): AuditEvent[] {
    return askOk<AuditEvent[]>({ kind: "audit", scope, key });
  }
  counts(): never {
    throw new Error("counts of a remote store are read on the main thread");
  }
  claimBodyFormat(): never {
    throw new Error("the body format of a remote store is settled on the main thread");
  }
  // A PostgreSQL ledger keeps no witness: there is no place outside the database this host was told of, and a
  // witness inside it would be restored with it, telling nothing. So a PostgreSQL ledger restored from an
  // older backup is not detected (docs/design.md "Older history" says so): `seen` answers nothing, and
  // keeping and forgetting keep nothing, without asking the main thread.
  witnessSeen(): undefined {
    return undefined;
  }
  witnessKeep(): void {}
  witnessForget(): void {}
  close(): void {}
}

/** The ledger, or why it could not be opened (the handle's factory throws it as a storage error). */
let store: SyncStore = new MemoryStore();
let openError: string | undefined;
try {
  if (init.store.kind === "sqlite") store = new SqliteStore(init.store);
  else if (init.store.kind === "remote") store = new RemoteStore();
} catch (e) {
  openError = e instanceof Error ? e.message : String(e);
}

/** The ledger clock: this host's, or (remote) the database's, re-read each second and carried forward; never backwards. */
const now: () => bigint = (() => {
  let last = 0n;
  if (init.store.kind !== "remote") {
    return () => (last = (() => { const t = BigInt(Date.now()); return t > last ? t : last; })());
  }
  let readAt = -Infinity;
  let readMs = 0n;
  return () => {
    if (performance.now() - readAt >= 1000) {
      const sent = performance.now();
      const answer = ask({ kind: "now" });
      // Unreachable database: carry the last reading forward; every write fails until it is back.
      if ("ok" in answer) {
        readAt = (sent + performance.now()) / 2;
        readMs = answer.ok as bigint;
      }
    }
    const t = readMs + BigInt(Math.floor(performance.now() - readAt));
    if (t > last) last = t;
    return last;
  };
})();

const ifaces = {
  "once:core/types": {},
  "once:core/ledger": ledgerImports(store),
  "once:core/ledger-json": ledgerJsonImports(),
  "once:core/clock": { now },
  // Asked once per ledger, for the secret provider keys are derived with (the guest keeps it in
  // the ledger; this host never sees it). The OS's source, nothing weaker.
  "once:core/entropy": { fill: (len: number): Uint8Array => new Uint8Array(randomBytes(len)) },
  // Beside the ledger, where a restore of it does not reach (an SQLite ledger's `<path>.witness`); the guest
  // keeps each grant here before it leaves, and asks here before it grants.
  "once:core/witness": witnessImports(store),
  "once:core/provider": {
    lookup(tool: string, providerKey: string, args: string): Evidence {
      const answer = ask({ kind: "lookup", tool, providerKey, args, now: now() });
      return "ok" in answer ? (answer.ok as Evidence) : { tag: "unknown", val: answer.failed };
    },
  },
  "once:core/operator": {
    escalate(escalation: Escalation): boolean {
      const answer = ask({ kind: "escalate", escalation });
      return "ok" in answer && answer.ok === true;
    },
  },
};
const instantiate = await loadComponent(init.genDir);

let instance: Exports | undefined;
let configuration: Configuration | undefined;

function fresh(): Exports {
  const x = instantiate(ifaces);
  if (configuration) x.configure(configuration);
  return x;
}

function handle(req: Request): Response {
  // Two requests are not exports: the ledger clock, and settling the body format of the store, which lives here.
  if (req.op === "now") return { id: req.id, value: now() };
  if (req.op === "claimBodyFormat") {
    try {
      store.claimBodyFormat(req.args[0] as number);
      return { id: req.id, value: null };
    } catch (e) {
      const message = e instanceof Error ? e.message : String(e);
      return { id: req.id, error: { tag: "storage", val: message } };
    }
  }
  try {
    instance ??= fresh();
    const f = instance[req.op];
    if (typeof f !== "function") return { id: req.id, trap: `no export ${req.op}` };
    const value = f(...req.args);
    if (req.op === "configure") configuration = req.args[0] as Configuration;
    return { id: req.id, value };
  } catch (e) {
    if (e && typeof e === "object" && Object.prototype.hasOwnProperty.call(e, "payload")) {
      // A refused configuration may leave the instance half-configured: the next call gets a fresh one.
      if (req.op === "configure") instance = undefined;
      return { id: req.id, error: (e as { payload: unknown }).payload };
    }
    instance = undefined;
    return { id: req.id, trap: e instanceof Error ? e.message : String(e) };
  }
}

port.on("message", (req: Request | { close: true }) => {
  if ("close" in req) {
    store.close();
    port.close();
    return;
  }
  // The ledger clock after the export: the handle carries it forward instead of asking again.
  port.postMessage({ ...handle(req), now: now() });
});
port.postMessage(openError === undefined ? { ready: true } : { openError });
