// OpenAI Agents JS (`@openai/agents`): a tool() whose execute runs through once.
import { type FunctionTool, type ToolExecuteArgument, type ToolInputParameters, type ToolOptions, tool } from "@openai/agents";
import { OnceError } from "../errors.js";
import type { Once } from "../once.js";
import { type Keying, checkKeying, textForModel, withDispatchSignal } from "./keying.js";

// The keying options' types, so an application can name them (`ApplicationKey<I>`, `DerivedKey`).
export type { ApplicationKey, DerivedKey, Keying } from "./keying.js";

/**
 * `tool()`'s options (the input type of `key`, `scope` and `execute` is inferred from `parameters`), plus
 * how once keys each call: `key` (the application's operation key) or `deriveKeyFrom` (the JSON pointers of
 * the effect fields), one of the two required; and `scope`, `lookup`, `policy`.
 */
export type ProtectedToolOptions<TParameters extends ToolInputParameters = undefined, Context = unknown> = ToolOptions<
  TParameters,
  Context
> &
  Keying<ToolExecuteArgument<TParameters>> & {
    /** The tool's name: also the tool once's policy and records are under. */
    name: string;
  };

/**
 * `tool({...})` with its `execute` protected under the tool's `name`: sent once per operation key, the
 * stored result replayed after. A call that ends without a confirmed effect (rejected, not sent, unknown,
 * in flight, conflict, blocked) — or a once error such as a key function returning no key — is shown to
 * the model as once's own text (the error's name and message, e.g. that the effect may exist and nothing
 * is sent until it is known), returned as the tool's output, and the run goes on; the SDK's default error
 * text ("An error occurred while running the tool. Please try again.") would tell the model the opposite.
 * With an `errorFunction` or an `outputSchema` of your own, once's errors are thrown to it instead.
 * Throws InvalidArgumentsError when `options` gives neither `key` nor `deriveKeyFrom`.
 */
export function protectedTool<TParameters extends ToolInputParameters = undefined, Context = unknown>(
  once: Once,
  options: ProtectedToolOptions<TParameters, Context>,
): FunctionTool<Context, TParameters> {
  type I = ToolExecuteArgument<TParameters>;
  const keying = checkKeying<I>(`protectedTool(${options?.name})`, options);
  const { key: _key, deriveKeyFrom: _derive, scope: _scope, lookup, policy: _policy, execute, ...rest } = options;
  const userExecute = execute as (input: I, runContext: unknown, details: unknown) => unknown;
  const run = once.protect<I, unknown>(
    options.name,
    (input, dispatch, context) => {
      const [runContext, details] = context as [unknown, unknown];
      // The SDK's details (tool call, abort signal), its signal joined by the dispatch timeout's.
      return userExecute(input, runContext, withDispatchSignal(details, "signal", dispatch));
    },
    { lookup, policy: keying.policy },
  );
  // Whoever configured error handling themselves gets once's errors as errors.
  const ownErrorHandling = options.errorFunction !== undefined || options.outputSchema !== undefined;
  const protectedExecute = async (input: I, runContext?: unknown, details?: unknown) => {
    try {
      return await run(input, {
        // Absent input is left to `run`, which refuses it before the key function reads a field of it.
        key: input == null ? undefined : keying.keyOf(input),
        scope: input == null ? undefined : keying.scopeOf(input),
        context: [runContext, details],
      });
    } catch (e) {
      if (e instanceof OnceError && !ownErrorHandling) return textForModel(e);
      throw e;
    }
  };
  return tool({ ...rest, execute: protectedExecute } as unknown as ToolOptions<TParameters, Context>) as FunctionTool<
    Context,
    TParameters
  >;
}
