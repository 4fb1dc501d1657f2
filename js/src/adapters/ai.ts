// Vercel AI SDK (`ai` 5, 6 and 7): a tool({...}) whose execute runs through once.
// The types are structural (nothing is imported from "ai"): the tool's own type is kept, and its input
// type is read from its execute, so one signature serves every major whose tools have
// `execute(input, options)` (5: ToolCallOptions, 6 and 7: ToolExecutionOptions).
import { InvalidArgumentsError } from "../errors.js";
import type { Once } from "../once.js";
import { type Keying, checkKeying, withDispatchSignal } from "./keying.js";

// The keying options' types, so an application can name them (`ApplicationKey<I>`, `DerivedKey`).
export type { ApplicationKey, DerivedKey, Keying } from "./keying.js";

/** An AI SDK tool as far as protecting it needs: its (optional) execute. */
export interface AiTool {
  execute?: (input: never, options: never) => unknown;
}

/**
 * The input type of an AI SDK tool: the first parameter of its execute (for `tool({ inputSchema, execute })`,
 * the schema's type). A tool type that is a union (ai 7's `Tool`) gives the input of the members that execute.
 */
export type ToolInput<T> = T extends { execute?: infer E } ? (E extends (input: infer I, ...rest: never[]) => unknown ? I : never) : never;

/**
 * How a protected AI SDK tool keys its calls: `key` (the application's operation key of each call) or
 * `deriveKeyFrom` (the JSON pointers of the effect fields); one of the two is required. Plus `scope`,
 * `lookup` and `policy`.
 */
export type ProtectToolOptions<I> = Keying<I>;

/**
 * `t` with its `execute` protected under the tool name `name`: sent once per operation key, the stored
 * result replayed after. A call that ends without a confirmed effect (rejected, not sent, unknown, in
 * flight, conflict, blocked) throws the OutcomeError saying so; the AI SDK turns a throw into the
 * tool's error and shows the model its text (`error-text`: once's message), and the run goes on.
 * Throws InvalidArgumentsError when `options` gives neither `key` nor `deriveKeyFrom`, or `t` has no
 * execute. An execute that streams (returns an AsyncIterable) is not supported.
 */
export function protectTool<T extends AiTool>(once: Once, name: string, t: T, options: ProtectToolOptions<ToolInput<T>>): T {
  type I = ToolInput<T>;
  const execute = (t as { execute?: (input: I, callOptions: unknown) => unknown }).execute;
  if (typeof execute !== "function") throw new InvalidArgumentsError(`protectTool(${name}): the tool has no execute`, "/execute");
  const keying = checkKeying<I>(`protectTool(${name})`, options);
  const run = once.protect<I, unknown>(name, (input, dispatch, callOptions) => execute(input, withDispatchSignal(callOptions, "abortSignal", dispatch)), {
    lookup: options.lookup,
    policy: keying.policy,
  });
  return {
    ...t,
    // The AI SDK's per-call options (tool-call id, messages, abort signal) reach the function, its
    // abort signal joined by the dispatch timeout's; none of them is part of the operation's identity.
    // Async, so that a key function's error is a rejected call like every other (the framework shows it).
    // Absent input is left to `run`, which refuses it before the key function reads a field of it.
    execute: async (input: I, callOptions: unknown) =>
      run(input, {
        key: input == null ? undefined : keying.keyOf(input),
        scope: input == null ? undefined : keying.scopeOf(input),
        context: callOptions,
      }),
  };
}
