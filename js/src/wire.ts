// The JSON form (the top comment of wit/once.wit): `protocol`'s `start`,
// `report` and `resume` carry JSON text in serde's form of the Rust types generated from the WIT
// (snake_case fields, UpperCamelCase case names, a case without payload as its
// name, else `{"Name": payload}`; `result` as `{"Ok": …}` / `{"Err": …}`).
// Written here by hand, and read into the shapes jco gives every other value
// (camelCase fields, `{tag, val}` variants, kebab-case enum cases, u64 as
// bigint), one decoder per type: nothing reflects on a type per call.
//
// Integers: a u64 in the JSON form may be past 2^53 (an absent row's due-at is
// i64::MAX; a lease may end at u64::MAX), which JSON.parse would round. The
// decoders read the text with JSON.parse (fast, native) and, when a u64 field
// holds a number past 2^53 (the one value JSON.parse may have rounded), read it
// again with an exact reader that keeps every integer literal past
// Number.MAX_SAFE_INTEGER as a bigint. `parse` is that reader for any text (it
// takes JSON.parse's path when no run of 16 digits, where such an integer would
// be, is in the text); `stringify` writes a bigint back as a bare integer.
import { ComponentError, engineError } from "./errors.js";
import type {
  Account,
  BlockReason,
  Confirmation,
  Effect,
  Ending,
  Error as EnginePayload,
  Grant,
  JsonErrorKind,
  KeySource,
  Repeat,
  ReplayVia,
  State,
  Step,
  WaitReason,
} from "./wit.js";

/** Text that is not the JSON form of what it should be; says what and where. */
export class WireError extends Error {
  override name = "WireError";
}

// ---------------------------------------------------------------- exact JSON

const NUMBER = /-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/y;

/** A JSON reader that keeps every integer exact: a bigint when it is past Number.MAX_SAFE_INTEGER. */
class ExactReader {
  private at = 0;
  constructor(private readonly s: string) {}

  document(): unknown {
    const v = this.value(0);
    this.ws();
    if (this.at !== this.s.length) this.fail("trailing data");
    return v;
  }

  private fail(why: string): never {
    throw new WireError(`${why} at offset ${this.at}`);
  }

  private ws(): void {
    const s = this.s;
    for (;;) {
      const c = s.charCodeAt(this.at);
      if (c !== 0x20 && c !== 0x0a && c !== 0x0d && c !== 0x09) return;
      this.at++;
    }
  }

  private value(depth: number): unknown {
    if (depth > 128) this.fail("nested too deep");
    this.ws();
    switch (this.s.charCodeAt(this.at)) {
      case 0x7b: // {
        return this.object(depth);
      case 0x5b: // [
        return this.array(depth);
      case 0x22: // "
        return this.string();
      case 0x74: // t
        return this.literal("true", true);
      case 0x66: // f
        return this.literal("false", false);
      case 0x6e: // n
        return this.literal("null", null);
      default:
        return this.number();
    }
  }

  private literal<T>(word: string, v: T): T {
    if (!this.s.startsWith(word, this.at)) this.fail("unexpected character");
    this.at += word.length;
    return v;
  }

  private number(): number | bigint {
    NUMBER.lastIndex = this.at;
    const m = NUMBER.exec(this.s);
    if (m === null) this.fail(this.at >= this.s.length ? "unexpected end" : "unexpected character");
    this.at = NUMBER.lastIndex;
    const text = m[0];
    const n = Number(text);
    // An integer literal past 2^53 keeps its digits; a fraction or exponent is a double.
    return m[1] === undefined && m[2] === undefined && !Number.isSafeInteger(n) ? BigInt(text) : n;
  }

  private string(): string {
    const s = this.s;
    const start = this.at;
    let escaped = false;
    let i = start + 1;
    for (;;) {
      if (i >= s.length) {
        this.at = i;
        this.fail("unterminated string");
      }
      const c = s.charCodeAt(i);
      if (c === 0x22) break;
      if (c === 0x5c) {
        escaped = true;
        i += 2;
        continue;
      }
      if (c < 0x20) {
        this.at = i;
        this.fail("a control character in a string");
      }
      i++;
    }
    this.at = i + 1;
    if (!escaped) return s.slice(start + 1, i);
    try {
      return JSON.parse(s.slice(start, i + 1)) as string;
    } catch {
      this.at = start;
      return this.fail("a bad escape in a string");
    }
  }

  private array(depth: number): unknown[] {
    this.at++;
    const out: unknown[] = [];
    this.ws();
    if (this.s.charCodeAt(this.at) === 0x5d) {
      this.at++;
      return out;
    }
    for (;;) {
      out.push(this.value(depth + 1));
      this.ws();
      const c = this.s.charCodeAt(this.at++);
      if (c === 0x5d) return out;
      if (c !== 0x2c) {
        this.at--;
        this.fail("expected , or ]");
      }
    }
  }

  private object(depth: number): Record<string, unknown> {
    this.at++;
    const out: Record<string, unknown> = {};
    this.ws();
    if (this.s.charCodeAt(this.at) === 0x7d) {
      this.at++;
      return out;
    }
    for (;;) {
      this.ws();
      if (this.s.charCodeAt(this.at) !== 0x22) this.fail("expected a member name");
      const k = this.string();
      this.ws();
      if (this.s.charCodeAt(this.at) !== 0x3a) this.fail("expected :");
      this.at++;
      const v = this.value(depth + 1);
      // An own member even for "__proto__", as JSON.parse makes it.
      if (k === "__proto__") Object.defineProperty(out, k, { value: v, enumerable: true, writable: true, configurable: true });
      else out[k] = v;
      this.ws();
      const c = this.s.charCodeAt(this.at++);
      if (c === 0x7d) return out;
      if (c !== 0x2c) {
        this.at--;
        this.fail("expected , or }");
      }
    }
  }
}

/** Whether `text` has a run of 16 digits: only such a run can spell an integer past 2^53 (2^53 has 16 digits). */
function longDigits(text: string): boolean {
  let run = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c >= 0x30 && c <= 0x39) {
      if (++run === 16) return true;
    } else run = 0;
  }
  return false;
}

function nativeParse(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new WireError((e as Error).message);
  }
}

/** JSON text as a value, every integer exact (a bigint past Number.MAX_SAFE_INTEGER); a WireError when it is not JSON. */
export function parse(text: string): unknown {
  return longDigits(text) ? new ExactReader(text).document() : nativeParse(text);
}

/** Thrown by a decoder that met a number JSON.parse may have rounded: the text is read again, exactly. */
const INEXACT = Symbol("inexact");
/** Whether the value being decoded was read exactly (a number past 2^53 is then a double the text spelt so). */
let exactPass = false;

/**
 * JSON text decoded by `decode`: parsed by JSON.parse, and read again exactly only when
 * `decode` meets a number past 2^53 where it wants an integer (the one case JSON.parse loses).
 */
function read<T>(text: string, decode: (v: unknown) => T): T {
  const v = nativeParse(text);
  try {
    return decode(v);
  } catch (e) {
    if (e !== INEXACT) throw e;
  }
  exactPass = true;
  try {
    return decode(new ExactReader(text).document());
  } finally {
    exactPass = false;
  }
}

/** A value as JSON text, a bigint as the integer it is (JSON.stringify refuses bigints). */
export function stringify(v: unknown): string {
  if (typeof v === "bigint") return v.toString();
  if (Array.isArray(v)) return `[${v.map((x) => (x === undefined ? "null" : stringify(x))).join(",")}]`;
  if (v !== null && typeof v === "object" && typeof (v as { toJSON?: unknown }).toJSON !== "function") {
    const members: string[] = [];
    for (const [k, x] of Object.entries(v)) if (x !== undefined) members.push(`${JSON.stringify(k)}:${stringify(x)}`);
    return `{${members.join(",")}}`;
  }
  return JSON.stringify(v) ?? "null";
}

// ---------------------------------------------------------------- fields

type Obj = Record<string, unknown>;

const U64_MAX = (1n << 64n) - 1n;

function obj(v: unknown, what: string): Obj {
  if (v === null || typeof v !== "object" || Array.isArray(v)) throw new WireError(`${what}: expected an object`);
  return v as Obj;
}

function str(v: unknown, what: string): string {
  if (typeof v !== "string") throw new WireError(`${what}: expected a string`);
  return v;
}

function optStr(v: unknown, what: string): string | undefined {
  return v === null ? undefined : str(v, what);
}

function bool(v: unknown, what: string): boolean {
  if (v !== true && v !== false) throw new WireError(`${what}: expected true or false`);
  return v;
}

function u64(v: unknown, what: string): bigint {
  if (typeof v === "number") {
    if (Number.isSafeInteger(v) && v >= 0) return BigInt(v);
    // JSON.parse rounds an integer past 2^53: the text is read again, exactly.
    if (!exactPass && Number.isFinite(v) && Math.abs(v) > Number.MAX_SAFE_INTEGER) throw INEXACT;
  } else if (typeof v === "bigint" && v >= 0n && v <= U64_MAX) return v;
  throw new WireError(`${what}: expected an integer in u64`);
}

function optU64(v: unknown, what: string): bigint | undefined {
  return v === null ? undefined : u64(v, what);
}

function u32(v: unknown, what: string): number {
  if (typeof v === "number" && Number.isInteger(v) && v >= 0 && v <= 0xffff_ffff) return v;
  throw new WireError(`${what}: expected an integer in u32`);
}

function optU32(v: unknown, what: string): number | undefined {
  return v === null ? undefined : u32(v, what);
}

/** The one member of a variant case with a payload: [name, payload]. */
function oneCase(v: unknown, what: string): [string, unknown] {
  const o = obj(v, what);
  const keys = Object.keys(o);
  if (keys.length !== 1) throw new WireError(`${what}: expected one case, got ${keys.length} members`);
  return [keys[0], o[keys[0]]];
}

/** An enum (or unit-variant) case by its JSON-form name. */
class Cases<T extends string> {
  private readonly byName: Map<string, T>;
  constructor(
    private readonly what: string,
    names: readonly T[],
  ) {
    // `in-flight` is `InFlight` in the JSON form.
    this.byName = new Map(names.map((n) => [n.replace(/(^|-)([a-z0-9])/g, (_, __, c: string) => c.toUpperCase()), n]));
  }
  of(v: unknown, where: string): T {
    const found = typeof v === "string" ? this.byName.get(v) : undefined;
    if (found === undefined) throw new WireError(`${where}: not a ${this.what}`);
    return found;
  }
  opt(v: unknown, where: string): T | undefined {
    return v === null ? undefined : this.of(v, where);
  }
}

const STATE = new Cases<State>("state", ["in-flight", "confirmed", "failed", "unknown", "absent", "superseded"]);
const KEY_SOURCE = new Cases<KeySource>("key-source", ["application", "derived"]);
const EFFECT = new Cases<Effect>("effect", ["happened", "none", "unknown"]);
const REPEAT = new Cases<Repeat>("repeat", ["replays", "waits", "retries", "refused"]);
const REPLAY_VIA = new Cases<ReplayVia>("replay-via", ["key", "derived-args", "provider"]);
const CONFIRMATION = new Cases<Confirmation>("confirmation", ["answer", "provider", "operator"]);
const WAIT_REASON = new Cases<WaitReason>("wait-reason", ["holder", "reconciliation", "retry"]);
const BLOCK_REASON = new Cases<BlockReason>("block-reason", [
  "route-blocked", "descriptor-changed", "quota", "attempt-budget", "identity-required", "identity-conflict",
  "payload-required", "superseded", "superseded-unresolved", "superseded-confirmed", "supersedes-missing", "expired",
  "unverified", "storage", "failed", "other-owner",
]);
const JSON_ERROR_KIND = new Cases<JsonErrorKind>("json-error-kind", [
  "syntax", "trailing-data", "duplicate-key", "lone-surrogate", "invalid-utf8", "non-finite-number",
  "number-out-of-range", "inexact-number", "too-deep", "too-large",
]);

// ---------------------------------------------------------------- what the host sends

/** The JSON form of a `call`. */
export function callText(scope: string, key: string | undefined, tool: string, args: string, supersedes: string | undefined,
  acknowledgeConfirmed: boolean): string {
  return JSON.stringify({
    scope,
    keys: key === undefined ? [] : [["application", key]],
    tool,
    args,
    supersedes: supersedes ?? null,
    acknowledge_confirmed: acknowledgeConfirmed,
  });
}

/** What a sender may answer (`Sent` in once.ts). */
type SentLike = { outcome: string; response?: unknown; error?: unknown; reason?: unknown };

/**
 * The JSON form of the `outcome` a sender's answer reports. An answer none of
 * `sent`'s constructors makes is reported ambiguous: the request may have left.
 */
export function outcomeText(s: SentLike): string {
  switch (s?.outcome) {
    case "not-sent":
      return '"NotSent"';
    case "success":
      if (typeof s.response === "string") return `{"Success":${JSON.stringify(s.response)}}`;
      break;
    case "rejected":
      if (typeof s.error === "string") return `{"Rejected":${JSON.stringify(s.error)}}`;
      break;
    case "ambiguous":
      if (typeof s.reason === "string") return `{"Ambiguous":${JSON.stringify(s.reason)}}`;
      break;
  }
  const shown = (() => {
    try {
      return stringify(s);
    } catch {
      return String(s);
    }
  })();
  return JSON.stringify({
    Ambiguous: `the sender answered ${shown.slice(0, 200)}, none of sent.success/rejected/ambiguous/notSent`,
  });
}

// ---------------------------------------------------------------- what the guest answers

function grant(v: unknown): Grant {
  const g = obj(v, "grant");
  return {
    scope: str(g.scope, "grant.scope"),
    key: str(g.key, "grant.key"),
    tool: str(g.tool, "grant.tool"),
    attempt: u32(g.attempt, "grant.attempt"),
    fence: str(g.fence, "grant.fence"),
    providerKey: str(g.provider_key, "grant.provider_key"),
    args: str(g.args, "grant.args"),
    leaseUntil: u64(g.lease_until, "grant.lease_until"),
    sendBy: u64(g.send_by, "grant.send_by"),
    timeoutMs: u64(g.timeout_ms, "grant.timeout_ms"),
  };
}

function ending(v: unknown): Ending {
  const [name, payload] = oneCase(v, "ending");
  const p = obj(payload, `ending.${name}`);
  switch (name) {
    case "Confirmed":
      return {
        tag: "confirmed",
        val: {
          receipt: str(p.receipt, "confirmed.receipt"),
          replayed: bool(p.replayed, "confirmed.replayed"),
          via: REPLAY_VIA.opt(p.via, "confirmed.via"),
          confirmedBy: CONFIRMATION.of(p.confirmed_by, "confirmed.confirmed_by"),
          at: u64(p.at, "confirmed.at"),
          windowUntil: optU64(p.window_until, "confirmed.window_until"),
          attempt: optU32(p.attempt, "confirmed.attempt"),
          earlierAttempts: EFFECT.of(p.earlier_attempts, "confirmed.earlier_attempts"),
          possibleDuplicate: bool(p.possible_duplicate, "confirmed.possible_duplicate"),
        },
      };
    case "Rejected":
      return { tag: "rejected", val: { error: str(p.error, "rejected.error"), attempt: u32(p.attempt, "rejected.attempt") } };
    case "NotSent":
      return { tag: "not-sent", val: { attempts: u32(p.attempts, "not_sent.attempts") } };
    case "Unknown":
      return {
        tag: "unknown",
        val: {
          since: u64(p.since, "unknown.since"),
          deadline: u64(p.deadline, "unknown.deadline"),
          reason: str(p.reason, "unknown.reason"),
          nextRead: optU64(p.next_read, "unknown.next_read"),
        },
      };
    case "InFlight":
      return { tag: "in-flight", val: { leaseUntil: u64(p.lease_until, "in_flight.lease_until") } };
    case "Conflict":
      return {
        tag: "conflict",
        val: {
          key: str(p.key, "conflict.key"),
          tool: str(p.tool, "conflict.tool"),
          fingerprint: str(p.fingerprint, "conflict.fingerprint"),
          args: str(p.args, "conflict.args"),
          state: STATE.of(p.state, "conflict.state"),
          createdAt: u64(p.created_at, "conflict.created_at"),
        },
      };
    case "Blocked":
      return {
        tag: "blocked",
        val: {
          reason: BLOCK_REASON.of(p.reason, "blocked.reason"),
          detail: str(p.detail, "blocked.detail"),
          receipt: optStr(p.receipt, "blocked.receipt"),
        },
      };
    case "Unrecorded":
      return { tag: "unrecorded", val: { response: str(p.response, "unrecorded.response") } };
    default:
      throw new WireError(`ending: no case ${JSON.stringify(name)}`);
  }
}

function account(v: unknown): Account {
  const a = obj(v, "account");
  return {
    scope: str(a.scope, "account.scope"),
    key: optStr(a.key, "account.key"),
    keySource: KEY_SOURCE.opt(a.key_source, "account.key_source"),
    tool: str(a.tool, "account.tool"),
    ending: ending(a.ending),
    effect: EFFECT.of(a.effect, "account.effect"),
    repeat: REPEAT.of(a.repeat, "account.repeat"),
    awaitsOperator: bool(a.awaits_operator, "account.awaits_operator"),
  };
}

function step(v: unknown): Step {
  if (v === "Direct") return { tag: "direct" };
  const [name, payload] = oneCase(v, "step");
  switch (name) {
    case "Dispatch":
      return { tag: "dispatch", val: grant(payload) };
    case "Done":
      return { tag: "done", val: account(payload) };
    case "Wait": {
      const w = obj(payload, "waiting");
      return {
        tag: "wait",
        val: {
          scope: str(w.scope, "waiting.scope"),
          key: str(w.key, "waiting.key"),
          next: u64(w.next, "waiting.next"),
          until: u64(w.until, "waiting.until"),
          reason: WAIT_REASON.of(w.reason, "waiting.reason"),
          meanwhile: account(w.meanwhile),
        },
      };
    }
    default:
      throw new WireError(`step: no case ${JSON.stringify(name)}`);
  }
}

/** An `error` in the JSON form, as jco gives the typed exports' errors. */
export function errorPayload(v: unknown): EnginePayload {
  switch (v) {
    case "NotFound":
      return { tag: "not-found" };
    case "FenceMismatch":
      return { tag: "fence-mismatch" };
    case "NotConfigured":
      return { tag: "not-configured" };
  }
  const [name, payload] = oneCase(v, "error");
  switch (name) {
    case "InvalidJson": {
      const j = obj(payload, "json_error");
      return {
        tag: "invalid-json",
        val: {
          kind: JSON_ERROR_KIND.of(j.kind, "json_error.kind"),
          pointer: str(j.pointer, "json_error.pointer"),
          offset: u64(j.offset, "json_error.offset"),
          message: str(j.message, "json_error.message"),
        },
      };
    }
    case "InvalidRequest":
      return { tag: "invalid-request", val: str(payload, "error.InvalidRequest") };
    case "InvalidPolicy":
      return { tag: "invalid-policy", val: str(payload, "error.InvalidPolicy") };
    case "Storage":
      return { tag: "storage", val: str(payload, "error.Storage") };
    case "InvalidTransition":
      return { tag: "invalid-transition", val: str(payload, "error.InvalidTransition") };
    default:
      throw new WireError(`error: no case ${JSON.stringify(name)}`);
  }
}

/**
 * A protocol export's answer, the JSON form of `result<step, error>`: the step,
 * or the engine's error thrown as its EngineError. Text that is not that form is
 * the component's failure, like a trap: a ComponentError is thrown.
 */
export function stepOf(text: string, where: string): Step {
  let answer: [true, Step] | [false, EnginePayload];
  try {
    answer = read(text, (v): [true, Step] | [false, EnginePayload] => {
      const [name, payload] = oneCase(v, "result");
      if (name === "Ok") return [true, step(payload)];
      if (name === "Err") return [false, errorPayload(payload)];
      throw new WireError(`result: no case ${JSON.stringify(name)}`);
    });
  } catch (e) {
    if (!(e instanceof WireError)) throw e;
    const shown = text.length > 200 ? `${text.slice(0, 200)}…` : text;
    throw new ComponentError(`${where}: the component's answer is not the JSON form of a result<step, error> (${e.message}): ${shown}`);
  }
  if (answer[0]) return answer[1];
  throw engineError(answer[1]);
}

