// Policies and configuration as a TypeScript user writes them (camelCase, ms as
// numbers), turned into the component's records. Every field left unset is
// filled by the engine; an inconsistent policy is refused by the engine.
import { InvalidArgumentsError } from "./errors.js";
import { toJson, type Json } from "./json.js";
import type { ApprovalRule, PolicyInput, ToolDescriptor } from "./wit.js";

/** A spend ceiling per scope per window. */
export interface Quota {
  /** JSON pointer to the amount in the args (an effect field), e.g. `/amount`. */
  spendField: string;
  /** Ceiling per scope per window, a decimal string (e.g. `"500.00"`). */
  ceiling: string;
  /** Decimal places of the minor unit (engine default 2). */
  decimals?: number;
  /** Window length in ms. */
  windowMs: number;
  /** Bucket shared by tools naming the same one (default the tool's name). */
  bucket?: string;
}

/**
 * When a person must approve a call before it is sent: never (the default), always, or when the amount at `field`
 * (a JSON pointer to an effect field) is above `above` (a decimal string; a missing or non-numeric amount needs
 * approval too).
 */
export type Approval = "never" | "always" | { above: { field: string; above: string } };

/** One tool's policy (wit/once.wit `policy-input`); unset fields are the engine's defaults. */
export interface Policy {
  route?: "direct" | "protect" | "block";
  identity?: "required" | "derived";
  keyArgument?: string;
  keySentByHost?: boolean;
  effectFields?: string[];
  verifyFirst?: boolean;
  providerClaimsKey?: boolean;
  lookup?: boolean;
  maxInFlightMs?: number;
  dispatchTimeoutMs?: number;
  leaseMs?: number;
  attemptBudget?: number;
  derivedWindowMs?: number;
  resolveDeadlineMs?: number;
  reconcileIntervalMs?: number;
  retentionMs?: number;
  tombstoneRetentionMs?: number;
  quota?: Quota;
  descriptorPin?: string;
  approval?: Approval;
  approvalValidMs?: number;
  approvalWaitMs?: number;
  /**
   * The provider account this host sends and reads the tool through: a stable name or fingerprint of its credential,
   * never the credential. A record keeps the account it was begun under; a call through another account is blocked
   * (`other-account`), and a read through another one never proves the effect absent.
   */
  providerAccount?: string;
}

/** A tool's definition as its server advertises it (routing by annotations, pinning). */
export interface Descriptor {
  name: string;
  inputSchema: Json;
  annotations?: Json;
}

const PLAIN = ["route", "identity", "keyArgument", "keySentByHost", "effectFields", "verifyFirst", "providerClaimsKey",
  "lookup", "attemptBudget", "descriptorPin", "providerAccount"] as const;
const MS = ["maxInFlightMs", "dispatchTimeoutMs", "leaseMs", "derivedWindowMs", "resolveDeadlineMs", "reconcileIntervalMs",
  "retentionMs", "tombstoneRetentionMs", "approvalValidMs", "approvalWaitMs"] as const;
const KNOWN = new Set<string>([...PLAIN, ...MS, "quota", "approval"]);

function u64(where: string, v: unknown): bigint {
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0) {
    throw new InvalidArgumentsError(`${where}: expected a non-negative integer of ms, got ${String(v)}`, where);
  }
  return BigInt(v);
}

/** A policy as the component's `policy-input` (unset stays unset). */
export function policyInput(p: Policy | undefined, where: string): PolicyInput {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(p ?? {})) {
    if (!KNOWN.has(k)) throw new InvalidArgumentsError(`${where}: unknown policy field ${JSON.stringify(k)}`, `${where}/${k}`);
    if (v === undefined) continue;
    if ((MS as readonly string[]).includes(k)) out[k] = u64(`${where}.${k}`, v);
    else if (k === "quota") {
      const q = v as Quota;
      out.quota = {
        spendField: q.spendField,
        ceiling: q.ceiling,
        decimals: q.decimals,
        windowMs: u64(`${where}.quota.windowMs`, q.windowMs),
        bucket: q.bucket,
      };
    } else if (k === "approval") out.approval = approvalRule(v, `${where}.approval`);
    else if (k === "providerAccount" && typeof v !== "string") {
      throw new InvalidArgumentsError(`${where}.providerAccount: expected a string, got ${JSON.stringify(v)}`, `${where}/${k}`);
    } else out[k] = v;
  }
  return out as PolicyInput;
}

function approvalRule(v: unknown, where: string): ApprovalRule {
  if (v === "never" || v === "always") return { tag: v };
  const above = (v as { above?: { field?: unknown; above?: unknown } } | null)?.above;
  if (typeof above?.field === "string" && typeof above.above === "string") {
    return { tag: "above", val: { field: above.field, above: above.above } };
  }
  throw new InvalidArgumentsError(
    `${where}: expected "never", "always" or { above: { field, above } } (strings), got ${JSON.stringify(v)}`,
    where,
  );
}

/** A descriptor as the component's `tool-descriptor` (schema and annotations as JSON text). */
export function descriptorInput(d: Descriptor | undefined): ToolDescriptor | undefined {
  if (!d) return undefined;
  return {
    name: d.name,
    inputSchema: toJson(d.inputSchema, "inputSchema"),
    annotations: d.annotations === undefined ? undefined : toJson(d.annotations, "annotations"),
  };
}
