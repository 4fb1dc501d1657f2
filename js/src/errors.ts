// Error classes: what went wrong with a call into once (not a decision it made),
// and, for `protect`, how a call ended without its effect confirmed.
import type { Account, Error as EnginePayload, JsonError } from "./wit.js";

/** A value with every bigint (u64 timestamps) as a number, for JSON. */
export const jsonSafe = (v: unknown): unknown => JSON.parse(JSON.stringify(v, (_, x) => (typeof x === "bigint" ? Number(x) : x)));

/** The base class of every error this package throws. */
export class OnceError extends Error {
  override name = "OnceError";
  /** Frameworks serialize tool errors to show them to a model: name and message (and the account, for outcomes). */
  toJSON(): Record<string, unknown> {
    return { name: this.name, message: this.message };
  }
}

/** The engine refused the input or could not use the ledger: the component's typed error. */
export class EngineError extends OnceError {
  override name = "EngineError";
  constructor(
    message: string,
    /** The component's error, as it stated it. */
    readonly payload: EnginePayload,
  ) {
    super(message);
  }
}

/** A JSON input (args, receipt) is malformed; `json` says what and where. */
export class InvalidJsonError extends EngineError {
  override name = "InvalidJsonError";
  readonly json: JsonError;
  constructor(json: JsonError, payload?: EnginePayload) {
    super(`invalid JSON at ${json.pointer || "/"} (byte ${json.offset}, ${json.kind}): ${json.message}`,
      payload ?? { tag: "invalid-json", val: json });
    this.json = json;
  }
}

/** A request field is unusable (an empty or oversized key, a bad pointer…). */
export class InvalidRequestError extends EngineError {
  override name = "InvalidRequestError";
}

/** A tool policy or the configuration is inconsistent; the message names the field. */
export class InvalidPolicyError extends EngineError {
  override name = "InvalidPolicyError";
}

/** The ledger failed on a read or a write (or could not be opened). */
export class StorageError extends EngineError {
  override name = "StorageError";
}

/** The component trapped or could not be instantiated; nothing was half-written. */
export class ComponentError extends OnceError {
  override name = "ComponentError";
}

/** A JavaScript value that is not JSON (undefined, a function, a bigint, NaN…) was given as args or a response. */
export class InvalidArgumentsError extends OnceError {
  override name = "InvalidArgumentsError";
  constructor(
    message: string,
    /** JSON pointer of the offending value. */
    readonly pointer: string,
  ) {
    super(message);
  }
}

/** The engine's error payload as an error of the matching class. */
export function engineError(payload: EnginePayload): EngineError {
  switch (payload.tag) {
    case "invalid-json":
      return new InvalidJsonError(payload.val, payload);
    case "invalid-request":
      return new InvalidRequestError(`invalid request: ${payload.val}`, payload);
    case "invalid-policy":
      return new InvalidPolicyError(`invalid policy: ${payload.val}`, payload);
    case "storage":
      return new StorageError(payload.val.startsWith("storage") ? payload.val : `storage: ${payload.val}`, payload);
    case "not-found":
      return new EngineError("no record for this scope and key", payload);
    case "fence-mismatch":
      return new EngineError("the fence belongs to no attempt of this record", payload);
    case "invalid-transition":
      return new EngineError(`invalid transition: ${payload.val}`, payload);
    case "not-configured":
      return new EngineError("the engine was called before it was configured", payload);
  }
}

const where = (a: Account) => `${a.tool} (scope ${JSON.stringify(a.scope)}, key ${JSON.stringify(a.key ?? "")})`;

/** A protected call that ended without a confirmed effect; `account` is the engine's account of it. */
export class OutcomeError extends OnceError {
  override name = "OutcomeError";
  constructor(
    message: string,
    /** How the call ended, as the engine stated it. */
    readonly account: Account,
  ) {
    super(message);
  }
  override toJSON(): Record<string, unknown> {
    return { ...super.toJSON(), account: jsonSafe(this.account) };
  }
}

/** The provider answered and did nothing. */
export class RejectedError extends OutcomeError {
  override name = "RejectedError";
}
/** The latest attempt was not sent: final once no attempt is left, else (`account.repeat` "retries") the same call sends the next. */
export class NotSentError extends OutcomeError {
  override name = "NotSentError";
}
/** The effect may or may not exist: nothing is sent until it is known. Do not retry under a new key. */
export class UnknownOutcomeError extends OutcomeError {
  override name = "UnknownOutcomeError";
}
/** An attempt still holds the operation; its outcome will be the answer. */
export class InFlightError extends OutcomeError {
  override name = "InFlightError";
}
/** The key names another call (tool or payload): nothing was sent. */
export class ConflictError extends OutcomeError {
  override name = "ConflictError";
}
/** Refused before anything was sent. */
export class BlockedError extends OutcomeError {
  override name = "BlockedError";
}

/** Nothing was sent: a person must approve this exact call first; the same call again waits for that decision. */
export class AwaitingApprovalError extends OutcomeError {
  override name = "AwaitingApprovalError";
}

/** The error a `protect`ed call throws for an account whose effect is not confirmed (undefined when it is). */
export function outcomeError(a: Account): OutcomeError | undefined {
  const e = a.ending;
  switch (e.tag) {
    case "confirmed":
    case "unrecorded":
      return undefined;
    case "rejected":
      return new RejectedError(
        `${where(a)}: the provider refused and did nothing (attempt ${e.val.attempt}): ${e.val.error}${unsettled(a)}`,
        a,
      );
    case "not-sent":
      // Final only once the budget is spent; while attempts are left (a retry's back-off) the same call goes on.
      return new NotSentError(
        a.repeat === "retries"
          ? `${where(a)}: attempt ${e.val.attempts} was not sent; the same call again (the same key) sends the next attempt, and a new key would make a second operation${unsettled(a)}`
          : `${where(a)}: nothing was sent in ${e.val.attempts} attempt(s), and no attempt is left${unsettled(a)}`,
        a,
      );
    case "unknown":
      return new UnknownOutcomeError(
        `${where(a)}: the effect may or may not have happened (${e.val.reason}); nothing is sent until it is known` +
          (a.awaitsOperator ? "; an operator will resolve it" : "; reconciliation goes on"),
        a,
      );
    case "in-flight":
      return new InFlightError(`${where(a)}: an attempt holds the operation until ${e.val.leaseUntil}`, a);
    case "conflict":
      return new ConflictError(
        `${where(a)}: the key already names another call (${e.val.tool}, fingerprint ${e.val.fingerprint}); nothing was sent`,
        a,
      );
    case "awaits-approval":
      return new AwaitingApprovalError(
        `${where(a)}: nothing more is sent until a person decides; a person must approve this exact call first ` +
          `(${e.val.reason}). The same call again (the same key) waits for that decision, and once approved it is ` +
          `sent, never twice${unsettled(a)}`,
        a,
      );
    case "blocked":
      return new BlockedError(
        `${where(a)}: blocked (${e.val.reason}): ${e.val.detail}` +
          (a.repeat === "waits" ? "; the same call again waits for its outcome" : "") +
          unsettled(a),
        a,
      );
  }
}

/** What a refusal adds when the engine does not know the operation had no effect: not "use a new key". */
function unsettled(a: Account): string {
  return a.effect === "unknown"
    ? "; whether the operation has an effect is not known yet, so do not repeat it under a new key until it is settled"
    : "";
}
