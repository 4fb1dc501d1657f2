// Vercel AI SDK (`ai` 5): a tool({...}) whose execute runs through once.
import type { Tool, ToolCallOptions } from "ai";
import { InvalidArgumentsError } from "../errors.js";
import type { Lookup, Once } from "../once.js";
import type { Policy } from "../policy.js";

/** How a protected AI SDK tool keys its calls. */
export interface ProtectToolOptions<I> {
  /**
   * The operation key of a call, from the application (e.g. the conversation's
   * operation id). It is given the tool input only: a model's tool-call id is never a key.
   */
  key: (input: I) => string | undefined;
  /** The scope (tenant / conversation); default the handle's. */
  scope?: string | ((input: I) => string);
  lookup?: Lookup;
  policy?: Policy;
}

/**
 * `t` with its `execute` protected under the tool name `name`: sent once per
 * operation key, the stored result replayed after; how a call ended without an
 * effect is thrown as an OutcomeError, which the AI SDK shows the model as the
 * tool's error. An execute that streams (returns an AsyncIterable) is not supported.
 */
export function protectTool<I, O>(once: Once, name: string, t: Tool<I, O>, options: ProtectToolOptions<I>): Tool<I, O> {
  const execute = t.execute;
  if (typeof execute !== "function") throw new InvalidArgumentsError(`protectTool(${name}): the tool has no execute`, "/execute");
  const run = once.protect<I, O>(
    name,
    (input, _dispatch, callOptions) => execute(input, callOptions as ToolCallOptions) as Promise<O>,
    { lookup: options.lookup, policy: options.policy },
  );
  const scopeOf = (input: I) => (typeof options.scope === "function" ? options.scope(input) : options.scope);
  return {
    ...t,
    execute: (input: I, callOptions: ToolCallOptions) =>
      run(input, { key: options.key(input), scope: scopeOf(input), context: callOptions }),
  } as Tool<I, O>;
}
