//! The study's four client retry policies: how many times each tries, and which identifiers it keeps.

use refund::tool_server::Dedupe;

/// A client's retry policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ClientPolicy {
    /// Retry up to 3 times, regenerating both the call id and the Idempotency-Key on each attempt.
    A,
    /// Retry up to 3 times, reusing the original call id as the Idempotency-Key.
    B,
    /// Retry up to 3 times, regenerating the key; the server dedupes on (tool, sha256(args)).
    C,
    /// Fail closed: never retry.
    D,
}

impl ClientPolicy {
    /// Every policy, in report order.
    pub const ALL: [ClientPolicy; 4] = [ClientPolicy::A, ClientPolicy::B, ClientPolicy::C, ClientPolicy::D];

    /// The study's letter.
    pub fn name(self) -> &'static str {
        match self {
            ClientPolicy::A => "A",
            ClientPolicy::B => "B",
            ClientPolicy::C => "C",
            ClientPolicy::D => "D",
        }
    }

    /// What the letter means, for the table.
    pub fn describe(self) -> &'static str {
        match self {
            ClientPolicy::A => "retry x3, new call id + key",
            ClientPolicy::B => "retry x3, call id as key",
            ClientPolicy::C => "retry x3, new key, args dedupe",
            ClientPolicy::D => "fail closed, never retry",
        }
    }

    /// Retries after the first attempt.
    pub fn retries(self) -> u32 {
        match self {
            ClientPolicy::D => 0,
            _ => 3,
        }
    }

    /// What the server this client talks to dedupes on (C's server hashes the args; the rest key on the header).
    pub fn dedupe(self) -> Dedupe {
        match self {
            ClientPolicy::C => Dedupe::Args,
            _ => Dedupe::Key,
        }
    }

    /// The call id the client puts in attempt `attempt` (from 1) of trial `trial`.
    pub fn call_id(self, trial: u64, attempt: u32) -> String {
        let attempt = if self == ClientPolicy::A { attempt } else { 1 };
        format!("call-{trial:08}-{attempt:02}")
    }

    /// The Idempotency-Key the client sends with that attempt, when it calls the server itself.
    pub fn idempotency_key(self, trial: u64, attempt: u32) -> String {
        match self {
            ClientPolicy::A | ClientPolicy::C => format!("idem-{trial:08}-{attempt:02}"),
            ClientPolicy::B | ClientPolicy::D => self.call_id(trial, attempt),
        }
    }

    /// The operation key the client hands once: the id it keeps across attempts (B's and D's call id, minted
    /// before the first attempt); A and C keep none, so once derives the identity from the arguments.
    pub fn operation_key(self, trial: u64) -> Option<String> {
        match self {
            ClientPolicy::A | ClientPolicy::C => None,
            ClientPolicy::B | ClientPolicy::D => Some(self.call_id(trial, 1)),
        }
    }
}
