// The main thread's side of the engine worker: export calls as promises, and
// the imports the worker cannot answer itself (the application's lookups and
// escalation sink, a PostgreSQL store) answered here, asynchronously.
import { MessageChannel, type MessagePort, Worker } from "node:worker_threads";
import { fileURLToPath } from "node:url";
import type { ImportAnswer, ImportRequest, Response, StoreSpec, WorkerInit } from "./channel.js";
import { ComponentError, StorageError, engineError } from "./errors.js";
import type { PostgresStore } from "./stores/postgres.js";
import type { Error as EnginePayload, Escalation, Evidence } from "./wit.js";

/** What the main thread supplies to the engine. */
export interface EngineHost {
  lookup(tool: string, providerKey: string, args: string, now: bigint): Promise<Evidence>;
  escalate(escalation: Escalation): Promise<boolean>;
  postgres?: PostgresStore;
}

const GEN_DIR = fileURLToPath(new URL("../gen/", import.meta.url));
const WORKER = new URL("./worker.js", import.meta.url);

/** One engine worker: a guest instance over one ledger. */
export class Engine {
  private next = 1;
  private pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: unknown) => void; sentAt: number }>();
  /** The last ledger-clock reading, and when (performance.now()) the request it answered was sent. */
  private clock = { now: 0, sentAt: -Infinity };
  private closed = false;

  private constructor(
    private worker: Worker,
    private flag: Int32Array,
    private replies: MessagePort,
    private host: EngineHost,
  ) {}

  /** Start the worker over `store`; a ledger that cannot be opened is a StorageError. */
  static async start(store: StoreSpec, host: EngineHost): Promise<Engine> {
    const flag = new SharedArrayBuffer(4);
    const { port1, port2 } = new MessageChannel();
    const init: WorkerInit = { genDir: GEN_DIR, store, flag, replies: port2 };
    const worker = new Worker(WORKER, { workerData: init, transferList: [port2] });
    const engine = new Engine(worker, new Int32Array(flag), port1, host);
    await new Promise<void>((resolve, reject) => {
      worker.once("error", (e) => reject(new ComponentError(`the once engine worker failed to start: ${e.message}`)));
      worker.once("message", (m: { ready?: true; openError?: string }) => {
        if (m.openError !== undefined) {
          void worker.terminate();
          reject(new StorageError(m.openError, { tag: "storage", val: m.openError }));
        } else resolve();
      });
    });
    worker.on("message", (m: Response | { import: ImportRequest }) => engine.onMessage(m));
    worker.on("error", (e) => engine.failAll(new ComponentError(`the once engine worker failed: ${e.message}`)));
    worker.on("exit", () => engine.failAll(new ComponentError("the once engine worker exited")));
    worker.unref();
    port1.unref();
    return engine;
  }

  /** Call an export of the component: its value, or its error as an EngineError. */
  call<T>(op: string, ...args: unknown[]): Promise<T> {
    if (this.closed) return Promise.reject(new ComponentError("this Once handle is closed"));
    const id = this.next++;
    if (this.pending.size === 0) this.worker.ref();
    return new Promise<T>((resolve, reject) => {
      this.pending.set(id, { resolve: resolve as (v: unknown) => void, reject, sentAt: performance.now() });
      this.worker.postMessage({ id, op, args });
    });
  }

  /**
   * The ledger clock now, carried forward from the last reading on this host's
   * monotonic clock, never behind it: the reading was taken after its request was sent.
   */
  ledgerNow(): number {
    return this.clock.now + Math.ceil(performance.now() - this.clock.sentAt);
  }

  private settle(id: number): { resolve: (v: unknown) => void; reject: (e: unknown) => void; sentAt: number } | undefined {
    const p = this.pending.get(id);
    this.pending.delete(id);
    if (this.pending.size === 0) this.worker.unref();
    return p;
  }

  private onMessage(m: Response | { import: ImportRequest }): void {
    if ("import" in m) {
      void this.answer(m.import);
      return;
    }
    const p = this.settle(m.id);
    if (!p) return;
    if (m.now !== undefined && p.sentAt >= this.clock.sentAt) this.clock = { now: Number(m.now), sentAt: p.sentAt };
    if ("value" in m) p.resolve(m.value);
    else if ("error" in m) p.reject(engineError(m.error as EnginePayload));
    else p.reject(new ComponentError(`the once component failed: ${m.trap}`));
  }

  private async answer(request: ImportRequest): Promise<void> {
    let answer: ImportAnswer;
    try {
      answer = { ok: await this.serve(request) };
    } catch (e) {
      answer = { failed: e instanceof Error ? e.message : String(e) };
    }
    this.replies.postMessage(answer);
    Atomics.store(this.flag, 0, 1);
    Atomics.notify(this.flag, 0);
  }

  private async serve(r: ImportRequest): Promise<unknown> {
    const pg = this.host.postgres;
    switch (r.kind) {
      case "lookup":
        return this.host.lookup(r.tool, r.providerKey, r.args, r.now);
      case "escalate":
        return this.host.escalate(r.escalation);
    }
    if (!pg) throw new Error(`storage: no main-thread store for ${r.kind}`);
    switch (r.kind) {
      case "get":
        return pg.get(r.table, r.scope, r.key);
      case "commit":
        return pg.commit(r.batch);
      case "scan":
        return pg.scan(r.table, r.states, r.dueBefore, r.owner, r.limit);
      case "audit":
        return pg.audit(r.scope, r.key);
      case "now":
        return pg.now();
    }
  }

  private failAll(e: Error): void {
    for (const id of [...this.pending.keys()]) this.settle(id)?.reject(e);
  }

  /** Stop the worker (and close the ledger). */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.worker.postMessage({ close: true });
    await this.worker.terminate();
    this.replies.close();
  }
}
