// once-exactly: exactly-once execution of an agent's side-effecting tool calls, over the once component.
export {
  Once,
  NotSent,
  Rejected,
  evidence,
  sent,
  type CallRequest,
  type Called,
  type Dispatch,
  type Escalate,
  type Lookup,
  type LookupQuery,
  type OnceOptions,
  type ProtectCall,
  type ProtectOptions,
  type Protected,
  type Send,
  type Sent,
  type SqliteHandleOptions,
  type ToolOptions,
} from "./once.js";
export * from "./errors.js";
export type { Json } from "./json.js";
export type { Descriptor, Policy, Quota } from "./policy.js";
export type {
  Account,
  Blocked,
  BlockReason,
  ConfirmedInfo,
  Effect,
  Ending,
  Escalation,
  Evidence,
  OperatorQueue,
  RecordView,
  Repeat,
  Resolvable,
  State,
  SweepResult,
  ToolPlan,
  ToolPolicy,
  UnknownInfo,
} from "./wit.js";
