//! An operation record's row body, written by hand: the same JSON text as
//! `serde_json::to_string(&rec)` (field order, escapes, enum names, the
//! fields left out), in a fraction of its time. Every transition writes one;
//! serde's writer, which escapes every field name and grows its buffer as it
//! goes, was the largest single cost of a protected call (BENCHMARKS.md row
//! 2). Reading stays serde's (`store::decode`), which is what proves the two
//! agree: the tests compare this writer with serde's on records in every state.

use alloc::string::String;

use crate::canon::write_string;
use crate::json_out::{Writer, confirmation, identity, key_source, route, state};
use crate::policy::{ApprovalRule, DEFAULT_APPROVAL_VALID_MS, DEFAULT_APPROVAL_WAIT_MS, Policy, Quota};
use crate::record::{Approval, Attempt, OpRecord, ReceiptFlaw, Reservation};

/// The format of every row body this engine writes: operation records (here),
/// tombstones and quota buckets (`store`). Hosts record it in the ledger
/// (`meta` key `body_format`, from [`crate::types::Configured::body_format`])
/// and refuse a ledger that holds a higher one, so an older build never reads
/// a body it would misread.
///
/// Bump it when a body an older build would misread is written: a field
/// whose absence an older build reads as something else, a changed meaning
/// or encoding of a field, a new enum case in a stored field. A field added
/// with a `serde(default)` that means what older builds assumed needs no
/// bump. This build reads every earlier format as well (its fields default
/// to what older bodies meant), which is what lets a host raise a ledger's
/// recorded format to this one; a change that cannot keep that promise needs
/// a migration, not only a bump.
///
/// Format 2: provider keys are derived with the ledger's secret, and
/// records name it (`key_secret`). A build of format 1 would go on deriving
/// guessable keys on a ledger whose others are not, so it must refuse one.
///
/// Format 3: the states `awaiting-approval` and `denied`, and approvals
/// (`approval_reason`, `approval`, a policy's `approval`); and a policy's
/// `provider_account`. A build of format 2 would not read the new states,
/// would send an attempt the rule holds for a person, and would answer and
/// send through any account. (Both came in one unreleased format: no build
/// of format 3 without `provider_account` was published.)
pub const BODY_FORMAT: u32 = 3;

/// The JSON text of `rec`, as serde_json writes it.
pub fn record_json(rec: &OpRecord) -> String {
    let mut w = Writer::with_capacity(1024 + rec.args.len() + rec.receipt.as_ref().map_or(0, String::len));
    w.0.push('{');
    w.str("scope", &rec.scope);
    w.str("key", &rec.key);
    w.raw("key_source", key_source(rec.key_source));
    w.str("tool", &rec.tool);
    w.str("fingerprint", &rec.fingerprint);
    w.str("args", &rec.args);
    w.str("provider_key", &rec.provider_key);
    some_str(&mut w, "key_secret", rec.key_secret.as_deref());
    flag(&mut w, "key_in_args", rec.key_in_args);
    w.str("owner", &rec.owner);
    w.raw("state", state(rec.state));
    w.key("attempts");
    w.list(&rec.attempts, attempt);
    if !rec.previous_fences.is_empty() {
        w.key("previous_fences");
        w.list(&rec.previous_fences, |w, f| write_string(f, &mut w.0));
    }
    if !rec.reported_previous.is_empty() {
        w.key("reported_previous");
        w.list(&rec.reported_previous, |w, f| write_string(f, &mut w.0));
    }
    some_str(&mut w, "receipt", rec.receipt.as_deref());
    if let Some(f) = &rec.receipt_flaw {
        w.key("receipt_flaw");
        receipt_flaw(&mut w, f);
    }
    some_num(&mut w, "confirmed_by", rec.confirmed_by.map(u64::from));
    if let Some(via) = rec.confirmed_via {
        w.raw("confirmed_via", confirmation(via));
    }
    flag(&mut w, "absence_forced", rec.absence_forced);
    some_str(&mut w, "error", rec.error.as_deref());
    some_str(&mut w, "unknown_reason", rec.unknown_reason.as_deref());
    some_num(&mut w, "since", rec.since);
    some_num(&mut w, "deadline", rec.deadline);
    some_num(&mut w, "next_check", rec.next_check);
    count(&mut w, "checks", rec.checks);
    some_num(&mut w, "last_read_position", rec.last_read_position);
    flag(&mut w, "escalated", rec.escalated);
    flag(&mut w, "escalation_acked", rec.escalation_acked);
    some_str(&mut w, "escalation_id", rec.escalation_id.as_deref());
    flag(&mut w, "possible_duplicate", rec.possible_duplicate);
    some_str(&mut w, "supersedes", rec.supersedes.as_deref());
    some_str(&mut w, "superseded_by", rec.superseded_by.as_deref());
    some_str(&mut w, "spend", rec.spend.as_deref());
    if let Some(r) = &rec.reservation {
        w.key("reservation");
        reservation(&mut w, r);
    }
    some_str(&mut w, "approval_reason", rec.approval_reason.as_deref());
    if let Some(a) = &rec.approval {
        w.key("approval");
        approval(&mut w, a);
    }
    w.key("policy");
    policy(&mut w, &rec.policy);
    count(&mut w, "replays", rec.replays);
    count(&mut w, "conflicts", rec.conflicts);
    w.num("created_at", rec.created_at);
    w.num("updated_at", rec.updated_at);
    w.num("transitioned_at", rec.transitioned_at);
    w.0.push('}');
    w.0
}

fn attempt(w: &mut Writer, a: &Attempt) {
    w.0.push('{');
    w.num("n", u64::from(a.n));
    w.str("fence", &a.fence);
    w.num("granted_at", a.granted_at);
    w.num("lease_until", a.lease_until);
    some_num(w, "ended_at", a.ended_at);
    some_str(w, "outcome", a.outcome.as_deref());
    flag(w, "owed", a.owed);
    if let Some(approved) = &a.approval {
        w.key("approval");
        approval(w, approved);
    }
    w.0.push('}');
}

fn approval(w: &mut Writer, a: &Approval) {
    w.0.push('{');
    w.str("note", &a.note);
    w.str("fingerprint", &a.fingerprint);
    w.num("at", a.at);
    w.num("valid_until", a.valid_until);
    w.0.push('}');
}

fn receipt_flaw(w: &mut Writer, f: &ReceiptFlaw) {
    w.0.push('{');
    w.str("problem", &f.problem);
    flag(w, "abridged", f.abridged);
    flag(w, "unparsed", f.unparsed);
    w.num("bytes", f.bytes);
    w.str("sha256", &f.sha256);
    w.0.push('}');
}

fn reservation(w: &mut Writer, r: &Reservation) {
    w.0.push('{');
    w.str("bucket", &r.bucket);
    w.num("window_start", r.window_start);
    w.num("window_ms", r.window_ms);
    w.str("units", &r.units);
    w.0.push('}');
}

fn policy(w: &mut Writer, p: &Policy) {
    w.0.push('{');
    if let Some(r) = p.route {
        w.raw("route", route(r));
    }
    w.raw("identity", identity(p.identity));
    some_str(w, "key_argument", p.key_argument.as_deref());
    flag(w, "key_sent_by_host", p.key_sent_by_host);
    if let Some(fields) = &p.effect_fields {
        w.key("effect_fields");
        w.list(fields, |w, f| write_string(f, &mut w.0));
    }
    flag(w, "verify_first", p.verify_first);
    flag(w, "provider_claims_key", p.provider_claims_key);
    w.bool("lookup", p.lookup);
    w.num("max_in_flight_ms", p.max_in_flight_ms);
    w.num("dispatch_timeout_ms", p.dispatch_timeout_ms);
    w.num("lease_ms", p.lease_ms);
    w.num("attempt_budget", u64::from(p.attempt_budget));
    w.num("derived_window_ms", p.derived_window_ms);
    w.num("resolve_deadline_ms", p.resolve_deadline_ms);
    w.num("reconcile_interval_ms", p.reconcile_interval_ms);
    w.num("retention_ms", p.retention_ms);
    w.num("tombstone_retention_ms", p.tombstone_retention_ms);
    if let Some(q) = &p.quota {
        w.key("quota");
        quota(w, q);
    }
    some_str(w, "descriptor_pin", p.descriptor_pin.as_deref());
    match &p.approval {
        ApprovalRule::Never => {}
        ApprovalRule::Always => w.raw("approval", "\"always\""),
        ApprovalRule::Above { field, above } => {
            w.key("approval");
            w.0.push_str("{\"above\":{");
            w.str("field", field);
            w.str("above", above);
            w.0.push_str("}}");
        }
    }
    if p.approval_valid_ms != DEFAULT_APPROVAL_VALID_MS {
        w.num("approval_valid_ms", p.approval_valid_ms);
    }
    if p.approval_wait_ms != DEFAULT_APPROVAL_WAIT_MS {
        w.num("approval_wait_ms", p.approval_wait_ms);
    }
    some_str(w, "provider_account", p.provider_account.as_deref());
    w.0.push('}');
}

fn quota(w: &mut Writer, q: &Quota) {
    w.0.push('{');
    w.str("spend_field", &q.spend_field);
    w.str("ceiling", &q.ceiling);
    w.num("decimals", u64::from(q.decimals));
    w.num("window_ms", q.window_ms);
    some_str(w, "bucket", q.bucket.as_deref());
    w.0.push('}');
}

// What a body leaves out (`OpRecord`'s serde attributes): an absent value, a
// false flag, a zero count.

/// A string member, left out when absent.
fn some_str(w: &mut Writer, name: &str, value: Option<&str>) {
    if let Some(v) = value {
        w.str(name, v);
    }
}

/// An integer member, left out when absent.
fn some_num(w: &mut Writer, name: &str, value: Option<u64>) {
    if let Some(v) = value {
        w.num(name, v);
    }
}

/// A flag, left out when false.
fn flag(w: &mut Writer, name: &str, value: bool) {
    if value {
        w.raw(name, "true");
    }
}

/// A count, left out when zero.
fn count(w: &mut Writer, name: &str, value: u32) {
    if value > 0 {
        w.num(name, u64::from(value));
    }
}
