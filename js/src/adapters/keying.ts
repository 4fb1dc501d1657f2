// How a framework adapter names the operation of each tool call, shared by the adapters.
// DESIGN.md "Defaults are the product": an adapter's identity is `required` by default; argument-hash
// identity is an explicit opt-in that names the effect fields, so a field a model varies between
// calls (a fresh request id, a reworded reason) can never turn a retry after an unknown outcome into
// a new operation with a second effect.
import { InvalidArgumentsError, OnceError } from "../errors.js";
import type { Lookup } from "../once.js";
import type { Policy } from "../policy.js";

/** The application's operation key of each call: required unless `deriveKeyFrom` is given. */
export interface ApplicationKey<I> {
  /**
   * The operation key of a call, minted by the application (e.g. from the conversation's state or the
   * order the call is about), never by the model: it is given the tool input only, not the model's
   * tool-call id. It must return a non-empty string for every call; anything else is an
   * `InvalidArgumentsError` and nothing is recorded or sent.
   */
  key: (input: I) => string;
  /** Not with `key`: the key is the application's. */
  deriveKeyFrom?: undefined;
}

/** Argument-hash identity, opted into by naming the effect fields. */
export interface DerivedKey {
  /**
   * JSON pointers of the effect-bearing fields (e.g. `["/order_id", "/amount"]`): the operation key is
   * derived from exactly these (the tool's policy gets `identity: "derived"` and these `effectFields`),
   * so two calls that differ only elsewhere (a fresh `request_id`, a reworded `reason`) are one
   * operation, and a call missing one of them is blocked (`payload-required`). Two deliberate
   * identical operations within the derived window collapse into one: give `key` for those.
   */
  deriveKeyFrom: readonly string[];
  /** Not with `deriveKeyFrom`: the key is derived. */
  key?: undefined;
}

/** What every adapter takes besides the framework's own tool options. */
export type Keying<I> = (ApplicationKey<I> | DerivedKey) & {
  /** The scope (tenant / conversation); default the handle's. */
  scope?: string | ((input: I) => string);
  /** This tool's authoritative read (else the handle's). */
  lookup?: Lookup;
  /** The tool's policy; its `identity` and `effectFields` must agree with `key` / `deriveKeyFrom`. */
  policy?: Policy;
};

/** A keying checked at wrap time: the policy to configure and each call's key and scope. */
export interface CheckedKeying<I> {
  /** The tool's policy with the identity the options chose (`required`, or `derived` over the effect fields). */
  policy: Policy;
  /** The call's operation key (undefined: derived by the engine), or an InvalidArgumentsError thrown. */
  keyOf: (input: I) => string | undefined;
  /** The call's scope (undefined: the handle's). */
  scopeOf: (input: I) => string | undefined;
}

const HOW =
  "give options.key, a function from the tool's input to the operation key the application minted " +
  "(e.g. key: (input) => `refund-order-${input.order_id}`), or, for argument-hash identity, " +
  'options.deriveKeyFrom, the JSON pointers of the effect fields (e.g. deriveKeyFrom: ["/order_id", "/amount"])';

/**
 * Check an adapter's keying options once, when the tool is wrapped (`where` names the adapter call, e.g.
 * `protectTool(refund_order)`), so a missing key is an error at start-up, not a derived key at the first call.
 */
export function checkKeying<I>(where: string, options: Keying<I> | undefined): CheckedKeying<I> {
  if (options === null || typeof options !== "object") {
    throw new InvalidArgumentsError(`${where}: no options: ${HOW}`, "/key");
  }
  // Read loosely: the options may come from JavaScript, where the types promised nothing.
  const loose = options as { key?: unknown; deriveKeyFrom?: unknown; policy?: Policy; scope?: unknown };
  const { key, deriveKeyFrom, policy = {}, scope } = loose;
  if (key !== undefined && deriveKeyFrom !== undefined) {
    throw new InvalidArgumentsError(
      `${where}: options.key and options.deriveKeyFrom are both given: an operation has one identity, choose one`,
      "/deriveKeyFrom",
    );
  }
  if (scope !== undefined && typeof scope !== "string" && typeof scope !== "function") {
    throw new InvalidArgumentsError(`${where}: options.scope must be a string or a function of the input`, "/scope");
  }
  const scopeOf = (input: I): string | undefined =>
    typeof scope === "function" ? (scope as (input: I) => string)(input) : (scope as string | undefined);
  if (deriveKeyFrom !== undefined) {
    if (!Array.isArray(deriveKeyFrom) || deriveKeyFrom.length === 0) {
      throw new InvalidArgumentsError(
        `${where}: options.deriveKeyFrom must be a non-empty array of JSON pointers to the effect fields (e.g. ["/order_id", "/amount"])`,
        "/deriveKeyFrom",
      );
    }
    deriveKeyFrom.forEach((p: unknown, i: number) => {
      // The engine checks the pointer syntax when the policy is configured; this catches the
      // common slip (a bare field name) at wrap time, where the message can say what to write.
      if (typeof p !== "string" || !p.startsWith("/")) {
        throw new InvalidArgumentsError(
          `${where}: options.deriveKeyFrom[${i}] is ${JSON.stringify(p)}, not a JSON pointer to an effect field (e.g. "/order_id")`,
          `/deriveKeyFrom/${i}`,
        );
      }
    });
    if (policy.identity === "required") {
      throw new InvalidArgumentsError(`${where}: options.policy.identity "required" contradicts options.deriveKeyFrom`, "/policy/identity");
    }
    if (policy.effectFields !== undefined && JSON.stringify(policy.effectFields) !== JSON.stringify(deriveKeyFrom)) {
      throw new InvalidArgumentsError(
        `${where}: options.policy.effectFields ${JSON.stringify(policy.effectFields)} differ from options.deriveKeyFrom ${JSON.stringify(deriveKeyFrom)}: give the effect fields once, in deriveKeyFrom`,
        "/policy/effectFields",
      );
    }
    return {
      policy: { ...policy, identity: "derived", effectFields: [...deriveKeyFrom] },
      keyOf: () => undefined,
      scopeOf,
    };
  }
  if (typeof key !== "function") {
    throw new InvalidArgumentsError(
      key === undefined ? `${where}: an application key is required: ${HOW}` : `${where}: options.key must be a function of the input: ${HOW}`,
      "/key",
    );
  }
  if (policy.identity === "derived") {
    throw new InvalidArgumentsError(
      `${where}: options.policy.identity "derived" contradicts options.key; for argument-hash identity give options.deriveKeyFrom instead`,
      "/policy/identity",
    );
  }
  return {
    // Required, so that even a call reaching the engine without a key is refused there, never derived.
    policy: { ...policy, identity: "required" },
    keyOf: (input) => {
      const k: unknown = (key as (input: I) => unknown)(input);
      if (typeof k !== "string" || k === "") {
        throw new InvalidArgumentsError(
          `${where}: options.key returned ${k === "" ? "an empty string" : String(k)} for this call; it must return ` +
            "the application's operation key, a non-empty string (nothing was recorded or sent)",
          "/key",
        );
      }
      return k;
    },
    scopeOf,
  };
}

/** The text a model is shown for a once error: once's own account of the call (never a generic "try again"). */
export function textForModel(error: OnceError): string {
  return `${error.name}: ${error.message}`;
}

/**
 * A framework's per-call options with the dispatch's abort signal joined to the framework's own under
 * `field` (the AI SDK's `abortSignal`, @openai/agents' `signal`): a tool that honours its framework's
 * signal is then also stopped when its answer is due (send-by plus the dispatch timeout), where once
 * waits for it to settle before it records the outcome. The framework's own signal still aborts it as
 * before.
 */
export function withDispatchSignal(options: unknown, field: string, dispatch: { signal: AbortSignal }): Record<string, unknown> {
  const base = typeof options === "object" && options !== null ? (options as Record<string, unknown>) : {};
  const own = base[field];
  const signal = own instanceof AbortSignal ? AbortSignal.any([own, dispatch.signal]) : dispatch.signal;
  return { ...base, [field]: signal };
}
