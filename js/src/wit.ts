// The component's types, as jco generated them from wit/once.wit (gen/ is built by `npm run build`),
// and, declared here in the same shapes, the ones that cross as JSON text (wire.ts reads and writes
// them): jco declares only the types a typed function uses.
import type {
  Blocked,
  ConfirmedInfo,
  Effect,
  Grant,
  InFlightInfo,
  KeySource,
  RecordSummary,
  RejectedInfo,
  Timestamp,
  UnknownInfo,
} from "../gen/interfaces/once-core-types.js";

export type * from "../gen/interfaces/once-core-types.js";

/** What a call waits for: another attempt holding the operation, or a read of the provider due later. */
export type WaitReason = "holder" | "reconciliation" | "retry";

/** What the same call again (the same key, or identical args for a derived key) would do. */
export type Repeat = "replays" | "waits" | "retries" | "refused";

/** Nothing was sent by any attempt, and no attempt is left. */
export interface NotSentInfo {
  /** Attempts granted (none of them sent). */
  attempts: number;
}

/** The effect happened, but the ledger could not record it: it is reconciled later. */
export interface UnrecordedInfo {
  /** The provider's response. */
  response: string;
}

/** How a call ended. */
export type Ending =
  | EndingConfirmed
  | EndingRejected
  | EndingNotSent
  | EndingUnknown
  | EndingInFlight
  | EndingConflict
  | EndingBlocked
  | EndingUnrecorded;
/** The effect happened. */
export interface EndingConfirmed {
  tag: "confirmed";
  val: ConfirmedInfo;
}
/** The provider refused and did nothing. */
export interface EndingRejected {
  tag: "rejected";
  val: RejectedInfo;
}
/** Nothing was sent, and no attempt is left. */
export interface EndingNotSent {
  tag: "not-sent";
  val: NotSentInfo;
}
/** The effect may exist; nothing is sent until it is known. */
export interface EndingUnknown {
  tag: "unknown";
  val: UnknownInfo;
}
/** Another attempt still holds it. */
export interface EndingInFlight {
  tag: "in-flight";
  val: InFlightInfo;
}
/** The key names another call (tool or payload): nothing was sent. */
export interface EndingConflict {
  tag: "conflict";
  val: RecordSummary;
}
/** Refused before anything was sent. */
export interface EndingBlocked {
  tag: "blocked";
  val: Blocked;
}
/** The effect happened; the ledger could not record it yet. */
export interface EndingUnrecorded {
  tag: "unrecorded";
  val: UnrecordedInfo;
}

/** Everything a caller shows about how a call ended, as facts the guest states. */
export interface Account {
  scope: string;
  /** The operation key (a derived one included), once there is one. */
  key?: string;
  /** Where the key came from. */
  keySource?: KeySource;
  tool: string;
  /** How it ended. */
  ending: Ending;
  /** Did the effect happen. */
  effect: Effect;
  /** What the same call again would do. */
  repeat: Repeat;
  /**
   * Nothing but an operator can settle this call now: the effect is unknown and no read of the
   * provider is scheduled (the tool has no lookup). The guest states it; a host keeps no watch on
   * such a call and tells its caller an operator must.
   */
  awaitsOperator: boolean;
}

/** A call that must wait before it can go on. */
export interface Waiting {
  scope: string;
  key: string;
  /** Ask again (`resume`) at this time (ledger clock). */
  next: Timestamp;
  /** The latest the wait can last: the holder's lease end, or the due read. */
  until: Timestamp;
  /** What it waits for. */
  reason: WaitReason;
  /** What to tell the caller if the host stops waiting now. */
  meanwhile: Account;
}

/** What the host does next. */
export type Step = StepDispatch | StepWait | StepDone | StepDirect;
/** Send exactly this, then `report` what happened. */
export interface StepDispatch {
  tag: "dispatch";
  val: Grant;
}
/** Sleep until `next`, then `resume`; or stop and show `meanwhile`. */
export interface StepWait {
  tag: "wait";
  val: Waiting;
}
/** Stop: this is how the call ended. */
export interface StepDone {
  tag: "done";
  val: Account;
}
/** Route DIRECT: send the call as it came, unprotected; nothing is recorded or reported. */
export interface StepDirect {
  tag: "direct";
}

