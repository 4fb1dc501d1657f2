// OpenAI Agents JS (`@openai/agents`): a tool() whose execute runs through once.
import { tool } from "@openai/agents";
import type { Lookup, Once } from "../once.js";
import type { Policy } from "../policy.js";

type ToolOptions = Parameters<typeof tool>[0];

/** `tool()`'s options, plus how once keys each call. */
export type ProtectedToolOptions<I> = ToolOptions & {
  /** The tool's name: also the tool once's policy and records are under. */
  name: string;
  /** The operation key of a call, from the application; given the input only, never the model's call id. */
  key: (input: I) => string | undefined;
  /** The scope (tenant / conversation); default the handle's. */
  scope?: string | ((input: I) => string);
  lookup?: Lookup;
  policy?: Policy;
};

/**
 * `tool({...})` with its `execute` protected under the tool's `name`: sent once per
 * operation key, the stored result replayed after; how a call ended without an
 * effect is thrown as an OutcomeError (the agent's `errorFunction` shows it to the model).
 */
export function protectedTool<I = unknown>(once: Once, options: ProtectedToolOptions<I>): ReturnType<typeof tool> {
  const { key, scope, lookup, policy, execute, ...rest } = options;
  const run = once.protect<I, unknown>(
    options.name,
    (input, _dispatch, context) => {
      const [runContext, details] = context as [unknown, unknown];
      return (execute as (i: I, c: unknown, d: unknown) => unknown)(input, runContext, details);
    },
    { lookup, policy },
  );
  const scopeOf = (input: I) => (typeof scope === "function" ? scope(input) : scope);
  return tool({
    ...rest,
    execute: (input: unknown, runContext?: unknown, details?: unknown) =>
      run(input as I, { key: key(input as I), scope: scopeOf(input as I), context: [runContext, details] }),
  } as ToolOptions);
}
