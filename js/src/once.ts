// The Once handle: the call protocol for one tool call, the same few lines
// every host runs — start it, send each grant the engine gives and report
// what happened, sleep through each wait, stop at the account the engine
// states. Every decision (retries, reconciliation, waiting on another
// attempt, what an outcome means) is the component's.
import type { StoreSpec } from "./channel.js";
import { Engine } from "./engine.js";
import { ComponentError, InvalidArgumentsError, StorageError, outcomeError } from "./errors.js";
import { type Json, receiptText, toJson } from "./json.js";
import { type Descriptor, type Policy, descriptorInput, policyInput } from "./policy.js";
import { type Synchronous, synchronousMode } from "./stores/store.js";
import type { PostgresStore } from "./stores/postgres.js";
import type {
  Account,
  Call,
  Configuration,
  Configured,
  Escalation,
  Evidence,
  Grant,
  OperatorQueue,
  Outcome,
  QueueFilter,
  RecordView,
  Resolution,
  Settings,
  State,
  Step,
  SweepResult,
  ToolConfig,
  ToolPlan,
} from "./wit.js";

/** What a lookup is asked: is there an effect for this provider key? */
export interface LookupQuery {
  tool: string;
  /** The key the provider saw (argument, header): derived from (scope, operation key). */
  providerKey: string;
  /** The canonical dispatch args. */
  args: Json;
  /** The ledger clock when the read started: a linearizable read answers `evidence.absent(now)`. */
  now: number;
}

/** The provider's authoritative read (never the write path): its evidence. */
export type Lookup = (q: LookupQuery) => Evidence | Promise<Evidence>;

/** The escalation sink: true when it accepted the escalation (it dedupes on `escalation.id`). */
export type Escalate = (escalation: Escalation) => boolean | Promise<boolean>;

/** Evidence a lookup returns. */
export const evidence = {
  /** The effect exists: its receipt (any value; its JSON projection, `receiptText`, is stored). */
  confirmed: (receipt: unknown): Evidence => ({ tag: "confirmed", val: receiptText(receipt) }),
  /** No effect, as of `readPosition` (ledger clock, ms): every commit at or before it is visible. */
  absent: (readPosition: number | bigint): Evidence => ({ tag: "absent", val: BigInt(readPosition) }),
  /** The read could not tell. */
  unknown: (reason: string): Evidence => ({ tag: "unknown", val: reason }),
};

/** What the provider did to one dispatch, as the sender saw it. */
export type Sent =
  | { outcome: "success"; response: string }
  | { outcome: "rejected"; error: string }
  | { outcome: "ambiguous"; reason: string }
  | { outcome: "not-sent" };

/** Constructors of Sent. */
export const sent = {
  /** The effect happened; `response` (any value; its JSON projection, `receiptText`, is stored) is the receipt. */
  success: (response: unknown): Sent => ({ outcome: "success", response: receiptText(response) }),
  /**
   * The effect happened; the provider's response as the JSON text it sent. A lone surrogate in it (a string
   * cut inside a character: not text, which a WIT string cannot carry) is stored as U+FFFD: the success is
   * recorded, never lost over its receipt's form.
   */
  successJson: (response: string): Sent => ({ outcome: "success", response }),
  /** The provider answered and did nothing (a definite rejection). */
  rejected: (error: string): Sent => ({ outcome: "rejected", error }),
  /** Timeout, disconnect, 5xx after sending: the effect may exist. */
  ambiguous: (reason: string): Sent => ({ outcome: "ambiguous", reason }),
  /** Nothing left this host (e.g. the connection was refused). */
  notSent: (): Sent => ({ outcome: "not-sent" }),
};

/** A lone surrogate: a UTF-16 half that no other half completes (not text; a WIT string cannot hold one). */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;
// Node's own scans (ES2024, in every Node this package supports; the ES2022 lib does not declare them): a
// call's strings are scanned natively, and the regex runs only to say where a refused one goes wrong.
const { isWellFormed, toWellFormed } = String.prototype as unknown as {
  isWellFormed: (this: string) => boolean;
  toWellFormed: (this: string) => string;
};

/**
 * The `outcome` a sender's answer reports. An answer none of `sent`'s constructors makes (a sender's slip,
 * in a language that does not check it) is reported ambiguous: the request may have left.
 */
export function outcomeOf(s: Sent): Outcome {
  const answer = s as { outcome?: unknown; response?: unknown; error?: unknown; reason?: unknown } | null | undefined;
  switch (answer?.outcome) {
    case "not-sent":
      return { tag: "not-sent" };
    case "success":
      if (typeof answer.response === "string") return { tag: "success", val: wellFormed(answer.response) };
      break;
    case "rejected":
      if (typeof answer.error === "string") return { tag: "rejected", val: wellFormed(answer.error) };
      break;
    case "ambiguous":
      if (typeof answer.reason === "string") return { tag: "ambiguous", val: wellFormed(answer.reason) };
      break;
  }
  let shown: string;
  try {
    shown = String(JSON.stringify(answer, (_, v: unknown) => (typeof v === "bigint" ? v.toString() : v)));
  } catch {
    shown = String(answer);
  }
  return { tag: "ambiguous", val: `the sender answered ${shown.slice(0, 200)}, none of sent.success/rejected/ambiguous/notSent` };
}

/** `text` with each lone surrogate replaced by U+FFFD. */
function wellFormed(text: string): string {
  return toWellFormed.call(text);
}

/** What the sender is asked to send: exactly these args, once. */
export interface Dispatch {
  /**
   * A DIRECT call (the engine's `direct` step: a read-only tool), sent unprotected: nothing is
   * recorded or reported, and it has no key, attempt or provider key ("", 0 and ""). Tell the two
   * kinds apart by this, never by those values.
   */
  direct: boolean;
  /** Scope: the call's own, for a DIRECT call too. */
  scope: string;
  /** Operation key (empty for a DIRECT call). */
  key: string;
  tool: string;
  /** Attempt number, from 1 (0 for a DIRECT call). */
  attempt: number;
  /** The key to hand the provider; empty for a DIRECT call. */
  providerKey: string;
  /** The args to send (a key argument already set to the provider key). */
  args: Json;
  /** The same, as the canonical JSON text the engine recorded. */
  argsJson: string;
  /** How long the provider may take; no answer by `answerBy` is reported ambiguous. */
  timeoutMs: number;
  /**
   * The last moment to start sending, on `performance.now()`: the engine's send-by, taken early, never
   * late (undefined for a DIRECT call, which has none). The host checks it just before the send.
   */
  sendBefore?: number;
  /**
   * When the answer is due, on `performance.now()`: `sendBefore` plus the timeout, which ends inside the
   * attempt's lease (for a DIRECT call, the timeout from hand-over). `signal` is aborted then.
   */
  answerBy: number;
  /** Aborted at `answerBy`. */
  signal: AbortSignal;
}

/** Sends one dispatch and says what the provider did. */
export type Send = (dispatch: Dispatch) => Sent | Promise<Sent>;

/** How a call ended. */
export type Called =
  /** A protected call ended (or the wait for it was given up): the engine's account. */
  | { kind: "done"; account: Account }
  /** A DIRECT tool was sent unprotected; what the sender saw. */
  | { kind: "direct"; sent: Sent }
  /** The effect happened, but recording it failed inside once; it is reconciled later. Never mint a new key for it. */
  | { kind: "unreported"; response: string; error: string };

/** One protected call. */
export interface CallRequest {
  /** Tenant / agent / conversation namespace. */
  scope: string;
  /** The operation key the application minted before the first attempt (omit for a derived key). */
  key?: string;
  tool: string;
  /** The tool's args, a JSON value (`{}` for none: `undefined` and `null` are refused); or `argsJson`. */
  args?: unknown;
  /** The args as JSON text, passed to the engine as written. */
  argsJson?: string;
  send: Send;
  /** A key in the same scope this operation replaces. */
  supersedes?: string;
  /** Proceed although the superseded original is confirmed. */
  acknowledgeConfirmed?: boolean;
  /** Longest wait for another attempt or a due read before answering what is known (default the handle's). */
  waitMs?: number;
}

/** A tool's configuration. */
export interface ToolOptions {
  policy?: Policy;
  descriptor?: Descriptor;
  /** This tool's authoritative read (else the handle's `lookup`). */
  lookup?: Lookup;
}

/** Options of a Once handle. */
export interface OnceOptions {
  /** Who dispatches for this handle (default `default`); records carry it. */
  owner?: string;
  /** Declared bound on the skew between the clocks of hosts sharing the ledger. */
  clockSkewMs?: number;
  /** What applies to every tool for what its own policy leaves unset, and to tools not named. */
  defaults?: Policy;
  tools?: Record<string, ToolOptions>;
  /** The provider's read for every tool without its own; without any, a tool has no lookup (an operator settles unknowns). */
  lookup?: Lookup;
  /** The escalation sink (default: a line on stderr, accepted). */
  escalate?: Escalate;
  /** How long a call waits for another attempt's outcome or a due read (default 10 000 ms). */
  waitMs?: number;
  /** How long one lookup may take before it counts as "could not tell" (default 30 000 ms). */
  lookupTimeoutMs?: number;
  /** The scope `protect`ed functions use when the call names none (default `default`). */
  scope?: string;
}

/** Options of an SQLite handle. */
export interface SqliteHandleOptions extends OnceOptions {
  synchronous?: Synchronous;
  busyTimeoutMs?: number;
}

/** Per-call options of a protected function. */
export interface ProtectCall {
  /** The operation key (else the `key` function's). */
  key?: string;
  scope?: string;
  supersedes?: string;
  acknowledgeConfirmed?: boolean;
  /** Handed to the protected function as its third argument (a framework's per-call options). */
  context?: unknown;
}

/** How `protect` builds each call. */
export interface ProtectOptions<A> {
  /** The operation key of a call, from the application's state (never a model's tool-call id). */
  key?: (args: A) => string | undefined;
  scope?: string;
  lookup?: Lookup;
  policy?: Policy;
  descriptor?: Descriptor;
}

/** A function whose calls are protected; `ready` settles once its policy is configured. */
export interface Protected<A, R> {
  (args: A, call?: ProtectCall): Promise<R>;
  ready: Promise<void>;
}

/** Thrown by a protected function: the provider answered and did nothing. */
export class Rejected extends Error {
  override name = "Rejected";
}

/** Thrown by a protected function: nothing was sent (e.g. the connection was refused). */
export class NotSent extends Error {
  override name = "NotSent";
}

/** What a DIRECT call sends as it came. */
interface DirectCall {
  scope: string;
  tool: string;
  args: string;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, Math.max(0, ms)));

/**
 * Run the sender until its answer is due (`answerBy`). Then the sender's signal is aborted and this waits
 * until the sender has settled, so nothing of it runs on after the outcome is reported: stopped by the
 * abort (or any throw), the outcome is ambiguous (what it sent may still have reached the provider); if it
 * answered anyway, its answer is the outcome. A sender that ignores its signal holds the call until it
 * settles.
 */
async function runSend(send: Send, d: Omit<Dispatch, "signal">): Promise<Sent> {
  // Send-by on this host's clock, just before the send, as every host checks it: here `ledgerNow` is local
  // arithmetic and nothing is awaited since, so this guards against either changing.
  if (d.sendBefore !== undefined && performance.now() >= d.sendBefore) return sent.notSent();
  const abort = new AbortController();
  const due = d.direct ? `within ${d.timeoutMs} ms` : `within ${d.timeoutMs} ms of send-by`;
  const timer = setTimeout(() => abort.abort(new Error(`no answer ${due}`)), d.answerBy - performance.now());
  const answer = Promise.resolve().then(() => send({ ...d, signal: abort.signal }));
  try {
    return await answer;
  } catch (e) {
    const why = e instanceof Error ? e.message : String(e);
    if (abort.signal.aborted) return sent.ambiguous(`no answer ${due}: the sender was aborted (${why})`);
    return sent.ambiguous(`the sender threw: ${why}`);
  } finally {
    clearTimeout(timer);
  }
}

const logEscalation: Escalate = (e) => {
  process.stderr.write(`once: operator, look at ${e.scope}/${e.key} (${e.tool}, ${e.state}): ${e.reason}\n`);
  return true;
};

/**
 * Refuse absent args: `undefined` or `null` where a tool's arguments belong is a caller's slip (a missing
 * argument, an unset variable), not an operation with no arguments; read as `{}` it would run the tool.
 */
function requireArgs(tool: string, args: unknown): void {
  if (args === undefined || args === null) {
    throw new InvalidArgumentsError(`${tool}: args at /: ${args} is not a tool's arguments (pass an object; {} for none)`, "");
  }
}

/**
 * A string the component is handed, checked first: of the wrong type (a caller's slip the compiler did not
 * catch) it would fail inside the component; with a lone surrogate, which a WIT string cannot hold, jco
 * would replace it with U+FFFD, so that two different keys became one operation. Both are refused here,
 * before anything is recorded.
 */
function text(v: unknown, field: string, where: string): string {
  if (typeof v !== "string") {
    throw new InvalidArgumentsError(`${where}: ${field} must be a string, not ${v === null ? "null" : typeof v}`, `/${field}`);
  }
  const lone = isWellFormed.call(v) ? null : LONE_SURROGATE.exec(v);
  if (lone) {
    throw new InvalidArgumentsError(
      `${where}: ${field} holds a lone surrogate at index ${lone.index}, which is not text (a string cut inside a character?)`, `/${field}`);
  }
  return v;
}

/**
 * The typed `call` of a request, each field checked (`text`). `args` is `toJson`'s text when the caller gave
 * values (JSON.stringify escapes a lone surrogate, so it is not scanned again), else the caller's `argsJson`.
 */
function callOf(c: CallRequest, args: string): Call {
  const acknowledge = c.acknowledgeConfirmed ?? false;
  if (typeof acknowledge !== "boolean") {
    throw new InvalidArgumentsError(`call: acknowledgeConfirmed must be a boolean, not ${typeof acknowledge}`, "/acknowledgeConfirmed");
  }
  return {
    scope: text(c.scope, "scope", "call"),
    keys: c.key === undefined ? [] : [["application", text(c.key, "key", "call")]],
    tool: text(c.tool, "tool", "call"),
    args: c.argsJson === undefined ? args : text(c.argsJson, "argsJson", "call"),
    // `null` is none, as `undefined` is (plain JavaScript callers pass either).
    supersedes: c.supersedes == null ? undefined : text(c.supersedes, "supersedes", "call"),
    acknowledgeConfirmed: acknowledge,
  };
}

/** A handle on the once engine over one ledger. */
export class Once {
  private configuration!: Configuration;
  private configured!: Configured;
  private lookups = new Map<string, Lookup>();
  /** Each configured tool's options as given (setTool merges into them). */
  private tools = new Map<string, ToolOptions>();
  private settingLock: Promise<unknown> = Promise.resolve();
  /**
   * The operations a call of this handle is driving now (`drivingKey(scope, key)`), with each call's mark on it:
   * until when it counts (`performance.now()`; undefined while the call holds it). A call whose reply was lost waits
   * for its read to come due, then reads and sends the next attempt itself; a `settle` beside it (its sweep proves
   * the same absence and lists the dispatch owed) would race it for that attempt. Either winner keeps the effect
   * single, but when `settle` wins, the caller, who made one call, is told its operation already ran (a replay),
   * which reads like a duplicate it did not make. So `settle` leaves a driven operation to its call, which answers as
   * the one that sent it. While the call is in a send, its mark counts only until the deadline the engine gave the
   * answer: a send is the caller's code, which may hang past it (ignoring its signal), and the operation (its lease
   * over) is then the round's, as it would be without the mark.
   */
  private driving = new Map<string, Map<number, number | undefined>>();
  /** The next mark's id in `driving`. */
  private markIds = 0;

  private constructor(
    private engine: Engine,
    private options: OnceOptions,
    private postgresStore?: PostgresStore,
  ) {}

  /** A ledger in memory (gone with the process). */
  static memory(options: OnceOptions = {}): Promise<Once> {
    return Once.over({ kind: "memory" }, options);
  }

  /** An SQLite ledger file (created if missing), in the Rust host's format. */
  static sqlite(path: string, options: SqliteHandleOptions = {}): Promise<Once> {
    const { synchronous, busyTimeoutMs, ...rest } = options;
    let mode: Synchronous | undefined;
    try {
      mode = synchronous === undefined ? undefined : synchronousMode(synchronous);
    } catch (e) {
      return Promise.reject(new InvalidArgumentsError((e as Error).message, "/synchronous"));
    }
    return Once.over({ kind: "sqlite", path, synchronous: mode, busyTimeoutMs }, rest);
  }

  /** A PostgreSQL ledger (`postgres://…[?schema=name]`, default schema `once`), its clock the database's. */
  static async postgres(url: string, options: OnceOptions = {}): Promise<Once> {
    let store: PostgresStore;
    try {
      // Imported here: the module's own imports stay out of a process that never opens PostgreSQL.
      const { PostgresStore } = await import("./stores/postgres.js");
      store = await PostgresStore.open(url);
    } catch (e) {
      const message = e instanceof Error ? e.message : String(e);
      throw new StorageError(message.startsWith("postgres") ? message : `postgres: ${message}`, { tag: "storage", val: message });
    }
    return Once.over({ kind: "remote" }, options, store);
  }

  /** A PostgreSQL URL or an SQLite file path. */
  static open(location: string, options: OnceOptions = {}): Promise<Once> {
    return /^postgres(ql)?:\/\//.test(location) ? Once.postgres(location, options) : Once.sqlite(location, options);
  }

  private static async over(store: StoreSpec, options: OnceOptions, pg?: PostgresStore): Promise<Once> {
    let once: Once | undefined;
    const engine = await Engine.start(store, {
      lookup: (tool, providerKey, args, now) => once!.lookup(tool, providerKey, args, now),
      escalate: async (e) => (await (options.escalate ?? logEscalation)(e)) === true,
      postgres: pg,
    }).catch(async (e) => {
      await pg?.close();
      throw e;
    });
    once = new Once(engine, options, pg);
    try {
      for (const [tool, t] of Object.entries(options.tools ?? {})) {
        once.tools.set(tool, t);
        if (t.lookup) once.lookups.set(tool, t.lookup);
      }
      const settings = await engine.call<Settings>("defaultSettings");
      if (options.owner !== undefined) settings.owner = options.owner;
      if (options.clockSkewMs !== undefined) settings.clockSkewMs = BigInt(options.clockSkewMs);
      const defaults = policyInput(options.defaults, "defaults");
      // A fact of this host: without any lookup, no tool can be read.
      if (!options.lookup && defaults.lookup === undefined) defaults.lookup = false;
      const tools = Object.entries(options.tools ?? {}).map(([tool, t]) => once!.toolConfig(tool, t));
      // The ledger answers get and commit in WIT types (jco lifts a batch as fast as its JSON form).
      await once.configure({ settings, defaults, tools, ledgerEncoding: "typed", reads: "import" });
      // Configuring reads no row; everything after may. A ledger holding bodies of a later format than this
      // engine's is refused here, not misread by the first sweep, and a ledger without one gets it.
      await once.claimBodyFormat(once.configured.bodyFormat);
    } catch (e) {
      await once.close();
      throw e;
    }
    return once;
  }

  private toolConfig(tool: string, t: ToolOptions): ToolConfig {
    const policy = policyInput(t.policy, `tools.${tool}`);
    // A fact of this host: whether it can read this tool's provider (the defaults may say it cannot read others).
    if (policy.lookup === undefined) policy.lookup = Boolean(t.lookup ?? this.options.lookup);
    return { tool, policy, descriptor: descriptorInput(t.descriptor) };
  }

  /** Record the engine's body format in the ledger, or refuse a ledger holding a later one (a StorageError). */
  private async claimBodyFormat(format: number): Promise<void> {
    if (!this.postgresStore) {
      await this.engine.call("claimBodyFormat", format);
      return;
    }
    try {
      await this.postgresStore.claimBodyFormat(format);
    } catch (e) {
      const message = e instanceof Error ? e.message : String(e);
      throw new StorageError(`storage: ${message}`, { tag: "storage", val: message });
    }
  }

  private async configure(configuration: Configuration): Promise<void> {
    this.configured = await this.engine.call<Configured>("configure", configuration);
    this.configuration = configuration;
  }

  /**
   * Configure (or reconfigure) one tool; what `options` leaves out stays as configured, field by field of its
   * policy too (an adapter that sets the tool's identity keeps the quota, budget or verify-first the handle
   * configured). The engine fills and checks its policy.
   */
  setTool(tool: string, options: ToolOptions): Promise<ToolPlan> {
    // Checked before the lock: a refused name leaves the handle's settings as they were.
    try {
      text(tool, "tool", "setTool");
    } catch (e) {
      return Promise.reject(e);
    }
    const next = this.settingLock.then(async () => {
      const given = Object.fromEntries(Object.entries(options).filter(([, v]) => v !== undefined)) as ToolOptions;
      const before = this.tools.get(tool);
      const merged: ToolOptions = { ...before, ...given };
      if (before?.policy && given.policy) merged.policy = { ...before.policy, ...given.policy };
      const config = this.toolConfig(tool, merged);
      await this.configure({
        ...this.configuration,
        tools: [...this.configuration.tools.filter((t) => t.tool !== tool), config],
      });
      this.tools.set(tool, merged);
      if (merged.lookup) this.lookups.set(tool, merged.lookup);
      return this.plan(tool);
    });
    this.settingLock = next.catch(() => {});
    return next;
  }

  /** How `tool` is handled: its route and policy, every field decided by the engine. */
  plan(tool: string): ToolPlan {
    const own = this.configured.tools.find((p) => p.tool === tool);
    if (own) return own;
    const d = this.configured.defaults;
    return { tool, route: d.route ?? "protect", blocked: undefined, policy: d };
  }

  private async lookup(tool: string, providerKey: string, args: string, now: bigint): Promise<Evidence> {
    const read = this.lookups.get(tool) ?? this.options.lookup;
    if (!read) return evidence.unknown(`no lookup for ${tool} in this host`);
    const ms = this.options.lookupTimeoutMs ?? 30_000;
    let timer: NodeJS.Timeout | undefined;
    try {
      const answer = await Promise.race([
        Promise.resolve().then(() => read({ tool, providerKey, args: JSON.parse(args) as Json, now: Number(now) })),
        new Promise<Evidence>((r) => (timer = setTimeout(() => r(evidence.unknown(`lookup gave no answer within ${ms} ms`)), ms))),
      ]);
      const ok =
        answer &&
        ((answer.tag === "confirmed" && typeof answer.val === "string") ||
          (answer.tag === "absent" && typeof answer.val === "bigint") ||
          (answer.tag === "unknown" && typeof answer.val === "string"));
      return ok ? answer : evidence.unknown(`lookup for ${tool} returned no evidence (use evidence.confirmed/absent/unknown)`);
    } catch (e) {
      return evidence.unknown(`lookup for ${tool} failed: ${e instanceof Error ? e.message : String(e)}`);
    } finally {
      clearTimeout(timer);
    }
  }

  /** The ledger's clock (ms since the epoch; for PostgreSQL, the database's). */
  async now(): Promise<number> {
    return Number(await this.engine.call<bigint>("now"));
  }

  /** Protect one tool call: start it, send each grant with `send`, report, wait, until the engine's account. */
  async call(c: CallRequest): Promise<Called> {
    if (typeof c.send !== "function") throw new InvalidArgumentsError("call: `send` must be a function", "/send");
    if (c.argsJson === undefined) requireArgs(c.tool, c.args);
    const args = c.argsJson ?? toJson(c.args, "args");
    const call = callOf(c, args);
    const step = await this.engine.call<Step>("start", call);
    return this.drive(step, { scope: c.scope, tool: c.tool, args }, c.waitMs ?? this.options.waitMs ?? 10_000, c.send);
  }

  /** Go on with an operation from the ledger (after a crash): its holder's outcome, a read, or the owed dispatch. */
  async resume(scope: string, key: string, send: Send, waitMs?: number): Promise<Called> {
    const step = await this.engine.call<Step>("resume", text(scope, "scope", "resume"), text(key, "key", "resume"));
    return this.drive(step, undefined, waitMs ?? this.options.waitMs ?? 10_000, send);
  }

  /**
   * One round of background work: the sweep, then every owed dispatch it found (`sweep.owed`), each granted
   * just before it is sent and reported. Granting a round's dispatches together let the later ones' send-by
   * pass while earlier ones were sent ("not sent", an attempt spent).
   *
   * An owed dispatch a call of this handle is driving now is left to that call, which sends it itself and
   * answers as the one that sent it: had the round come first, the caller would be told its one call was a
   * replay. Once the call has returned or thrown, the next round takes what it left.
   */
  async settle(limit: number, send: Send): Promise<{ sweep: SweepResult; sent: Called[] }> {
    const sweep = await this.engine.call<SweepResult>("sweep", limit, false);
    const out: Called[] = [];
    for (const [scope, key] of sweep.owed) {
      // A call of this handle driving it sends it itself (`driving`).
      if (this.driven(scope, key)) continue;
      // Another host may have taken it since: then there is nothing to send.
      const step = await this.engine.call<Step>("resume", scope, key);
      if (step.tag === "dispatch") out.push(await this.drive(step, undefined, 0, send));
    }
    return { sweep, sent: out };
  }

  /** The sweep without sending: expire leases, reconcile due unknowns, escalate; owed dispatches are listed. */
  sweep(limit = 100): Promise<SweepResult> {
    return this.engine.call<SweepResult>("sweep", limit, false);
  }

  /** The loop every host runs: send, report, sleep, resume, until the engine says done (or the wait would outlast `patience`). */
  private async drive(step: Step, call: DirectCall | undefined, patienceMs: number, send: Send): Promise<Called> {
    const stopAt = performance.now() + patienceMs;
    // `stopAt` on the ledger clock, taken at the first wait: a call that sends and ends reads no clock first.
    let giveUpAt: number | undefined;
    // The operation this loop drives (`driving`), from the first step naming it until the loop returns or
    // throws. A loop can move to another key (a successor waits on the original it supersedes).
    let held: { op: string; id: number } | undefined;
    const follow = (scope: string, key: string) => {
      const op = drivingKey(scope, key);
      if (held?.op === op) {
        this.driving.get(op)?.set(held.id, undefined);
        return;
      }
      this.release(held);
      const marks = this.driving.get(op) ?? new Map<number, number | undefined>();
      this.driving.set(op, marks);
      held = { op, id: this.markIds++ };
      marks.set(held.id, undefined);
    };
    try {
      for (;;) {
        switch (step.tag) {
          case "dispatch": {
            const g: Grant = step.val;
            follow(g.scope, g.key);
            // This host's clock before the ledger's: the deadlines on it err early, never late.
            const handed = performance.now();
            const left = Number(g.sendBy) - this.engine.ledgerNow();
            // Never send after send-by: the whole timeout must end inside the lease.
            let result: Sent;
            if (left <= 0) result = sent.notSent();
            else {
              const d = dispatchOf(g, handed + left);
              // In the send, the mark counts until the answer's deadline, however long the send takes (`driving`).
              if (held !== undefined) this.driving.get(held.op)?.set(held.id, d.answerBy);
              result = await runSend(send, d);
              if (held !== undefined) this.driving.get(held.op)?.set(held.id, undefined);
            }
            try {
              step = await this.engine.call<Step>("report", g.scope, g.key, g.fence, outcomeOf(result));
            } catch (e) {
              // The effect happened: an error now would make the caller mint a new intent.
              if (result?.outcome === "success") return { kind: "unreported", response: result.response, error: String(e) };
              throw e;
            }
            break;
          }
          case "wait": {
            const w = step.val;
            follow(w.scope, w.key);
            const now = this.engine.ledgerNow();
            giveUpAt ??= now + (stopAt - performance.now());
            if (Number(w.next) > giveUpAt || performance.now() >= stopAt) return { kind: "done", account: w.meanwhile };
            await sleep(Math.min(Number(w.next) - now, stopAt - performance.now()));
            step = await this.engine.call<Step>("resume", w.scope, w.key);
            break;
          }
          case "done":
            return { kind: "done", account: step.val };
          case "direct": {
            if (!call) throw new ComponentError("a resumed operation answered direct");
            const timeoutMs = Number(this.plan(call.tool).policy.dispatchTimeoutMs);
            const args = JSON.parse(call.args) as Json;
            const answerBy = performance.now() + timeoutMs;
            const s = await runSend(send, {
              direct: true, scope: call.scope, key: "", tool: call.tool, attempt: 0, providerKey: "", args, argsJson: call.args, timeoutMs, answerBy,
            });
            return { kind: "direct", sent: s };
          }
        }
      }
    } finally {
      this.release(held);
    }
  }

  /** Whether a call of this handle is driving (scope, key) now (`driving`). */
  private driven(scope: string, key: string): boolean {
    const now = performance.now();
    for (const until of this.driving.get(drivingKey(scope, key))?.values() ?? []) {
      if (until === undefined || now < until) return true;
    }
    return false;
  }

  /** A loop's mark taken off (`driving`). */
  private release(held: { op: string; id: number } | undefined): void {
    if (held === undefined) return;
    const marks = this.driving.get(held.op);
    marks?.delete(held.id);
    if (marks?.size === 0) this.driving.delete(held.op);
  }

  /**
   * Protect an async function: each call is one operation, keyed by the application
   * (`options.key` or the call's `key`); it resolves with the function's result (sent
   * now, or the stored receipt replayed) or throws an OutcomeError saying how it ended.
   * The function throws `Rejected` for a definite refusal, `NotSent` when nothing left;
   * any other throw (or no answer within the dispatch timeout) may have had an effect.
   */
  protect<A, R>(
    tool: string,
    fn: (args: A, dispatch: Dispatch, context?: unknown) => Promise<R> | R,
    options: ProtectOptions<A> = {},
  ): Protected<A, R> {
    const ready = this.setTool(tool, { policy: options.policy, lookup: options.lookup, descriptor: options.descriptor }).then(
      () => undefined,
    );
    ready.catch(() => {});
    const protectedFn = (async (args: A, c: ProtectCall = {}) => {
      // Before the key function sees them (it would read a field of undefined) and before anything is recorded.
      requireArgs(tool, args);
      await ready;
      // A DIRECT call's own result (it is not recorded), kept per call.
      let direct: { value?: R; error?: unknown } = {};
      const send: Send = async (d) => {
        try {
          const value = await fn(d.args as A, d, c.context);
          if (d.direct) direct = { value };
          return sent.success(value === undefined ? null : value);
        } catch (e) {
          if (d.direct) direct = { error: e };
          if (e instanceof Rejected) return sent.rejected(e.message);
          if (e instanceof NotSent) return sent.notSent();
          return sent.ambiguous(e instanceof Error ? `${e.name}: ${e.message}` : String(e));
        }
      };
      const called = await this.call({
        scope: c.scope ?? options.scope ?? this.options.scope ?? "default",
        key: c.key ?? options.key?.(args),
        tool,
        args,
        send,
        supersedes: c.supersedes,
        acknowledgeConfirmed: c.acknowledgeConfirmed,
      });
      switch (called.kind) {
        case "direct":
          if ("error" in direct) throw direct.error;
          return direct.value as R;
        case "unreported":
          return JSON.parse(called.response) as R;
        case "done": {
          const e = called.account.ending;
          if (e.tag === "confirmed") return JSON.parse(e.val.receipt) as R;
          if (e.tag === "unrecorded") return JSON.parse(e.val.response) as R;
          throw outcomeError(called.account);
        }
      }
    }) as Protected<A, R>;
    protectedFn.ready = ready;
    return protectedFn;
  }

  /** A record and its audit trail (undefined when the ledger has none). */
  async inspect(scope: string, key: string): Promise<RecordView | undefined> {
    return this.engine.call<RecordView | undefined>("inspect", text(scope, "scope", "inspect"), text(key, "key", "inspect"));
  }

  /** A person approves a call awaiting approval, as recorded (its payload's fingerprint); `note` says who and why. */
  async approve(scope: string, key: string, note: string): Promise<State> {
    return this.engine.call<State>("resolve", text(scope, "scope", "approve"), text(key, "key", "approve"),
      { tag: "approve" } satisfies Resolution, text(note, "note", "approve"), false);
  }

  /** A person refuses a call awaiting approval: it ends denied and nothing is sent; `note` says who and why. */
  async deny(scope: string, key: string, note: string): Promise<State> {
    return this.engine.call<State>("resolve", text(scope, "scope", "deny"), text(key, "key", "deny"),
      { tag: "deny" } satisfies Resolution, text(note, "note", "deny"), false);
  }

  /** An operator's resolution of an unknown or absent record, audited with a note. */
  async resolve(scope: string, key: string, resolution: { confirmed: unknown } | "absent", note: string, force = false): Promise<State> {
    const r: Resolution = resolution === "absent" ? { tag: "absent" } : { tag: "confirmed", val: toJson(resolution.confirmed, "receipt") };
    return this.engine.call<State>("resolve", text(scope, "scope", "resolve"), text(key, "key", "resolve"), r,
      text(note, "note", "resolve"), force);
  }

  /** What needs a person: unknown, absent (dispatch owed), lease-expired and awaiting-approval records. */
  async queue(filter: QueueFilter = {}, limit = 100): Promise<OperatorQueue> {
    // `null` is none, as `undefined` is (plain JavaScript callers pass either).
    const scopes: unknown = filter.scopes;
    if (scopes != null && !Array.isArray(scopes)) {
      throw new InvalidArgumentsError(`queue: scopes must be an array of strings, not ${typeof scopes}`, "/scopes");
    }
    const checked: QueueFilter = {
      scopes: scopes == null ? undefined : scopes.map((s, i) => text(s, `scopes/${i}`, "queue")),
      tool: filter.tool == null ? undefined : text(filter.tool, "tool", "queue"),
      keyPrefix: filter.keyPrefix == null ? undefined : text(filter.keyPrefix, "keyPrefix", "queue"),
    };
    return this.engine.call<OperatorQueue>("queue", checked, limit);
  }

  /** RFC 8785 canonical form of a JSON text, computed by the component. */
  async canonicalize(json: string): Promise<string> {
    return this.engine.call<string>("canonicalize", new TextEncoder().encode(text(json, "json", "canonicalize")));
  }

  /** `sha256(JCS({"tool":…,"args":…}))`, computed by the component. */
  async fingerprint(tool: string, args: unknown): Promise<string> {
    return this.engine.call<string>("fingerprint", text(tool, "tool", "fingerprint"), toJson(args));
  }

  /** Stop the engine and close the ledger. */
  async close(): Promise<void> {
    await this.engine.close();
    await this.postgresStore?.close();
  }
}

/** The key of (scope, key) in `Once.driving`: one string, never the same for two pairs. */
function drivingKey(scope: string, key: string): string {
  return JSON.stringify([scope, key]);
}

/** A grant as its dispatch, to be sent before `sendBefore` (`performance.now()`). */
function dispatchOf(g: Grant, sendBefore: number): Omit<Dispatch, "signal"> {
  const timeoutMs = Number(g.timeoutMs);
  return {
    direct: false,
    scope: g.scope,
    key: g.key,
    tool: g.tool,
    attempt: g.attempt,
    providerKey: g.providerKey,
    args: JSON.parse(g.args) as Json,
    argsJson: g.args,
    timeoutMs,
    sendBefore,
    answerBy: sendBefore + timeoutMs,
  };
}

